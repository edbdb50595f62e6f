"""The decision, pure: the plan per environment and module, and one module's verdict table.
May import rules/ and tables/ (rows, resolve); no I/O library.
"""
