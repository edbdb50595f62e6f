"""The installed hal0 release: where it is, which release, the facts it judges slots by (one
module per fact source; reader puts them together). May import host.envfile; never restarts/.
"""
