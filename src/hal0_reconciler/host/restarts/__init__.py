"""Applying a relabel to a running slot as a careful operator would: the flow, its pure rules,
its state, hal0's API and who answers it. May import host.proc, host.envfile, hal0/.
"""
