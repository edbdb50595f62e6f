"""Moving modules aside and back, crash-safe: journal, folder operations, heal/restore/roll/prune,
their digests, and the same as a tree's owner. May import decision/, trees/, rules/.
"""
