"""Which tables a boot reads and what they ask for: CSV rows, the build target, resolving, reads,
the caches on disk. May import rules/, decision/ (the plan's types) and trees/ (reads as the owner).
"""
