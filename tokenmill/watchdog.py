"""Crash-only liveness: a call that hangs is worse than a crash.

librdkafka calls can block past the timeout passed to them (seen: a
`send_offsets_to_transaction` stuck for minutes after a broker restart, with
SIGTERM ignored because Python runs signal handlers only between bytecodes).
The watchdog is a daemon thread that ends the process with one clear line
when

- a guarded call has run past its limit, or
- the service loop has not beaten for `stall_s`,

so that the supervisor (systemd `Restart=on-failure`, the test harness)
restarts it, and the new process recovers from committed state.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tokenmill.log import get_logger

log = get_logger("tokenmill.watchdog")

EXIT_CODE = 1  # a failure: systemd's Restart=on-failure restarts it


@dataclass(frozen=True)
class Overdue:
    what: str
    blocked_s: float
    limit_s: float


def overdue(now: float, guards: dict[int, tuple[str, float, float]], last_beat: float,
            stall_s: float) -> Overdue | None:
    """The first guarded call past its limit, else a loop that stopped
    beating (pure: guards are token -> (what, started, limit))."""
    for what, started, limit in guards.values():
        if now - started > limit:
            return Overdue(what, now - started, limit)
    if not guards and now - last_beat > stall_s:
        return Overdue("the service loop", now - last_beat, stall_s)
    return None


class Watchdog:
    """Parameters: `service` (for the message), `stall_s` (longest the loop
    may go without `beat()` outside guarded calls), `check_s`, `on_overdue`
    (default: log one line and exit the process), `clock`."""

    def __init__(self, service: str, *, stall_s: float = 120.0, check_s: float = 1.0,
                 on_overdue: Callable[[Overdue], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.stall_s = stall_s
        self.check_s = check_s
        self.clock = clock
        self._on_overdue = on_overdue or self._exit
        self._lock = threading.Lock()
        self._guards: dict[int, tuple[str, float, float]] = {}
        self._next = 0
        self._last_beat = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        self._last_beat = self.clock()
        self._thread = threading.Thread(target=self._watch, name=f"{self.service}-watchdog",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def beat(self) -> None:
        self._last_beat = self.clock()

    @contextmanager
    def guard(self, what: str, limit_s: float) -> Iterator[None]:
        """A blocking call that must return within `limit_s`."""
        with self._lock:
            self._next += 1
            token = self._next
            self._guards[token] = (what, self.clock(), limit_s)
        try:
            yield
        finally:
            with self._lock:
                self._guards.pop(token, None)
            self.beat()

    def check(self) -> Overdue | None:
        with self._lock:
            guards = dict(self._guards)
        return overdue(self.clock(), guards, self._last_beat, self.stall_s)

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            late = self.check()
            if late is not None:
                self._on_overdue(late)
                return

    def _exit(self, late: Overdue) -> None:
        message = (f"{self.service}: {late.what} blocked for {late.blocked_s:.0f}s (limit "
                   f"{late.limit_s:.0f}s); exiting so that the supervisor restarts it from "
                   "committed state")
        log.error(message)
        sys.stderr.flush()
        os._exit(EXIT_CODE)
