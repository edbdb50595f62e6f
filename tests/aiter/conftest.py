"""Fixtures for the aiter suite (defined in aiter_support.py)."""

from aiter_support import (  # noqa: F401
    book,
    built_modules,
    make_tree,
    no_processes,
    real_configs,
    rules,
    shape_builder,
    so_builder,
)
