"""Which aiter is installed and which rules it follows: rule sets, routing, rules.toml and
routing.toml beside them. Imports nothing else of aiter: the bottom floor.
"""
