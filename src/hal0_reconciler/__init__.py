"""hal0-reconciler: keeps hal0 slot device labels and aiter's compiled registry true to the host.

No library API is promised: the command line and the systemd unit are the interface.
"""

__version__ = "0.3.0"
__all__ = ["__version__"]
