"""aiter's compiled modules kept true to its tables: the front (survey, monitor, findings,
explain, cli) here, over one subpackage per concept; nothing below imports the front.
"""
