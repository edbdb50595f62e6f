"""A tree handled with its owner's credentials: whose it is, the owner's child, fd operations
that never follow a link. May import host.proc; quarantine/ and registry/ for the child's ops.
"""
