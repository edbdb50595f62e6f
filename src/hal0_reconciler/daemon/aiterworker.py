"""The aiter check on a thread of its own, apart from the slot passes.

The slot worker only asks for a check (``request``: it never waits for one); this thread runs
the checks one at a time, the requests made while one runs folded into one more. So a check that
reads many modules never delays READY=1, the watchdog or a slot relabel: the slot worker's pass
ends, and is counted, whatever the aiter check is doing. The thread is started by the first
request, which comes only when a tree is configured: a daemon with no tree never starts it.

A check past its time budget (``[aiter] check_budget``) leaves the modules it has not read for
the next check (``aiter.survey``); ``SelfHeal`` says so once and retries after a back-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from hal0_reconciler import _log, lifecycle, threadname

log = _log.get_logger("hal0_reconciler.daemon.aiterworker")

THREAD_NAME = "hal0-aiter"
STOP_WAIT = 2.0
"""Seconds a stop waits for a running check (a check is abandoned past it: every file it moves
is moved atomically, so it is left old or new)."""


class AiterWorker(lifecycle.StartStop):
    """Runs ``check`` on its own thread whenever asked (``request``). ``start`` is lazy: the
    thread starts at the first request."""

    def __init__(self, check: Callable[[], None], *, name: str = THREAD_NAME) -> None:
        self._check = check
        self._name = name
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)
        self._pending = False
        self._stopping = False
        self._retiring = False  # drain: the thread ends once idle, a request starts a new one
        self._running = False
        self._thread: threading.Thread | None = None
        self.checks = 0  # checks run since start (tests read it)

    def request(self) -> None:
        """Ask for a check (never waits). Starts the thread the first time."""
        with self._lock:
            if self._stopping:
                return
            self._pending = True
            if self._thread is None:
                self._thread = threadname.NamedThread(
                    target=self._run, name=self._name, daemon=True
                )
                self._thread.start()
            self._wanted.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._stopping and not self._retiring:
                    self._wanted.wait()
                if self._stopping or (self._retiring and not self._pending):
                    return
                self._pending = False
                self._running = True
            try:
                self._check()
            except Exception:  # the check logs its own failures; this is a last guard
                log.exception("aiter.worker_check_failed")
            finally:
                with self._lock:
                    self._running = False
                    self.checks += 1
                    self._wanted.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no check runs or waits; False on timeout."""
        with self._lock:
            return self._wanted.wait_for(lambda: not (self._running or self._pending), timeout)

    def drain(self, timeout: float) -> bool:
        """Wait for the checks asked for, then end the thread (the next request starts a new
        one): a caller that drives passes one by one (tests, the bench) sees each check done
        when its pass returns, and leaves no thread behind. False on timeout."""
        if not self.wait_idle(timeout):
            return False
        with self._lock:
            thread, self._retiring = self._thread, True
            self._wanted.notify_all()
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            self._retiring = False
            if self._thread is thread and (thread is None or not thread.is_alive()):
                self._thread = None
        return thread is None or not thread.is_alive()

    def start(self) -> None:
        """Nothing: the thread starts at the first request."""

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            thread = self._thread
            self._wanted.notify_all()
        if thread is None:
            return
        thread.join(timeout=STOP_WAIT)
        if thread.is_alive():
            log.warning("aiter.check_abandoned", reason="a check was still running at exit")
