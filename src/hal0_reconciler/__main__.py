"""`python -m hal0_reconciler` runs the command line."""

import sys

from hal0_reconciler import cli

sys.exit(cli.main())
