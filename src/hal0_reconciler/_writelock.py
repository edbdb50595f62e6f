"""The one lock every line this process logs is written under (structlog's and stdlib's, from
any thread): two sinks with locks of their own could put two events on one line.

Its own module so that ``_log`` (the structlog side) and ``_logstd`` (the stdlib side) both
import it, and neither imports the other for it.
"""

from __future__ import annotations

import threading

WRITE_LOCK = threading.RLock()
