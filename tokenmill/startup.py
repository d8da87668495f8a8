"""Waiting for a dependency (Kafka, S3, an SGLang server) at start-up.

A service started before its broker, bucket or GPU server is up should wait
for it with a clear log line, not die with a traceback; and the wait must be
bounded. One mechanism for every dependency: `StartupWait` holds the pure
part (deadline, backoff, what to say), `wait_until_up` and
`wait_until_up_async` are the thin loops around a check that raises while
the dependency is down. `--startup-timeout-s` / `TOKENMILL_STARTUP_TIMEOUT_S`
bounds each wait; 0 means do not wait (one attempt, then one line).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tokenmill.backoff import Backoff
from tokenmill.log import get_logger

log = get_logger("tokenmill.startup")

T = TypeVar("T")

FIRST_DELAY_S = 0.5
MIN_DELAY_S = 0.05  # less time left than this: give up rather than spin
MAX_DELAY_S = 5.0
REMIND_EVERY_S = 30.0
TIMEOUT_HINT = "--startup-timeout-s / TOKENMILL_STARTUP_TIMEOUT_S"


class DependencyDown(RuntimeError):
    """A dependency did not come up within the start-up timeout (one line:
    what, where, why)."""


def retry_delay(attempt: int, remaining_s: float, *, first_s: float = FIRST_DELAY_S,
                cap_s: float = MAX_DELAY_S) -> float | None:
    """Seconds to sleep before attempt `attempt + 1` (attempts count from 1),
    or None when no time worth a retry is left. Doubles from `first_s` up to
    `cap_s`, and never sleeps past the deadline."""
    if not remaining_s >= MIN_DELAY_S or not math.isfinite(remaining_s):
        return None
    return min(Backoff(first_s=first_s, cap_s=cap_s).delay(attempt), remaining_s)


class StartupWait:
    """The bookkeeping of one wait: deadline, attempts, log lines, final error.

    `what` names the dependency ("Kafka", "S3", "the SGLang server"), `where`
    its address, `hint` how to fix it; `clock` is injectable for tests."""

    def __init__(self, what: str, where: str, *, timeout_s: float, hint: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.where = where
        self.timeout_s = timeout_s
        self.hint = hint
        self._clock = clock
        self.started = clock()
        self.attempts = 0
        self._last_reminder = self.started

    def waited_s(self) -> float:
        return self._clock() - self.started

    def failed(self, reason: str) -> float:
        """Record a failed attempt: the delay before the next one, or raise
        DependencyDown when the deadline has passed (or waiting is off)."""
        self.attempts += 1
        remaining = self.timeout_s - self.waited_s()
        delay = retry_delay(self.attempts, remaining)
        if delay is None:
            raise DependencyDown(self.give_up_message(reason))
        now = self._clock()
        if self.attempts == 1:
            log.warning(f"{self.what} is not up yet; waiting", at=self.where, reason=reason,
                        timeout_s=self.timeout_s)
        elif now - self._last_reminder >= REMIND_EVERY_S:
            self._last_reminder = now
            log.warning(f"still waiting for {self.what}", at=self.where, reason=reason,
                        waited_s=round(now - self.started, 1), timeout_s=self.timeout_s)
        return delay

    def succeeded(self) -> None:
        if self.attempts:
            log.info(f"{self.what} is up", at=self.where, waited_s=round(self.waited_s(), 1))

    def give_up_message(self, reason: str) -> str:
        if self.timeout_s <= 0:
            waited = f"not waiting ({TIMEOUT_HINT} is 0)"
        else:
            waited = f"waited {self.waited_s():.0f}s ({TIMEOUT_HINT} {self.timeout_s:g})"
        hint = f"; {self.hint}" if self.hint else ""
        return f"{self.what} at {self.where} is down: {reason}; {waited}{hint}"


def _reason(exc: BaseException) -> str:
    """An exception's short why: its `reason` attribute if it has one."""
    text = str(getattr(exc, "reason", None) or exc)
    return " ".join(text.split()) or type(exc).__name__


def wait_until_up(check: Callable[[], T], wait: StartupWait,
                  down: tuple[type[BaseException], ...],
                  sleep: Callable[[float], None] = time.sleep) -> T:
    """Call `check` until it returns; an exception of a `down` type means
    "not up yet" (retry), any other one propagates at once."""
    while True:
        try:
            result = check()
        except down as exc:
            sleep(wait.failed(_reason(exc)))
            continue
        wait.succeeded()
        return result


async def wait_until_up_async(check: Callable[[], Awaitable[T]], wait: StartupWait,
                              down: tuple[type[BaseException], ...]) -> T:
    """`wait_until_up` for a check that is a coroutine (the worker's HTTP client)."""
    while True:
        try:
            result = await check()
        except down as exc:
            await asyncio.sleep(wait.failed(_reason(exc)))
            continue
        wait.succeeded()
        return result


def process_age_s() -> float | None:
    """Seconds since this process was started (Linux, from /proc), so that a
    service's start-up line includes the interpreter's start and its imports,
    which happen before any of our code can take the time. None elsewhere."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22, after pid and (comm)
        ticks = os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / ticks, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class StartupLaps:
    """Where a service's start-up went, step by step, for its "ready" line:
    on a loaded host an operator otherwise sees only that a worker took 13 s
    to take its first request, not whether it waited for Kafka, the run's
    spec, its server or its transactions. `clock` is injectable for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 before_s: float | None = None) -> None:
        self._clock = clock
        self._last = clock()
        self.laps: dict[str, float] = {}
        if before_s is not None:
            self.laps["process"] = before_s

    def lap(self, step: str) -> None:
        """The time since the previous lap, under `step` (a repeated step adds up)."""
        now = self._clock()
        self.laps[step] = self.laps.get(step, 0.0) + (now - self._last)
        self._last = now

    def summary(self) -> dict[str, float]:
        """Each step's seconds and the total, rounded for a log line."""
        out = {step: round(s, 2) for step, s in self.laps.items()}
        out["total"] = round(sum(self.laps.values()), 2)
        return out
