"""`python -m hal0_reconciler` runs the command line (signals held first, see ``_entry``)."""

import sys

from hal0_reconciler import _entry

sys.exit(_entry.main())
