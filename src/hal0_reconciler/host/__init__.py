"""The host and hal0 as the policy sees them: the probe (probe, proc, identity, facts) here,
hal0's installed facts in hal0/, applying a relabel to a running slot in restarts/.
"""
