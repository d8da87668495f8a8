"""The worker's circuit breaker: a server that fails every request the same
way must not burn the dataset into dead letters.

Requests that fail for good (a 400 for context length, a 404/405/501 from a
server that is not SGLang, 5xx after every retry) are counted by cause over
the last `window` outcomes. When one cause makes up `threshold` of them, the
breaker opens: the failure that tripped it and every later one are *held*
(not recorded; the prompt waits and is tried again), so at most about
`threshold * window` failures were recorded before it opened, never the
dataset. While open, no request starts. After `cooldown_s` one probe request
goes through (half-open): a success closes the breaker, a failure of the
same kind opens it again for twice as long (up to `max_cooldown_s`). Only the
probe speaks for the server then: a request that started before the breaker
went half-open (in flight since before the failures began, say) and ends
while it is half-open changes nothing, or one slow old success would close it
on a server that still fails everything.

Pure state with an injected clock; `consumer/generation.py` consults it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

State = Literal["closed", "open", "half-open"]


@dataclass
class Breaker:
    window: int = 20
    threshold: float = 0.9
    cooldown_s: float = 30.0
    max_cooldown_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    state: State = "closed"
    cause: str | None = None  # what tripped it
    opened_at: float = 0.0
    trips: int = 0
    _outcomes: deque[str | None] = field(default_factory=deque)
    _cooldown: float = 0.0
    _probing: bool = False
    _half_open_at: float = 0.0

    def failure(self, cause: str, started: float | None = None) -> bool:
        """A request (begun at `started` on `clock`) failed for good with
        `cause`. True: record the failure; False: the breaker is (now) open,
        hold the prompt and retry later."""
        if self.state == "open":
            return False  # in flight when it opened: held too
        if self.state == "half-open":
            if self._before_probe(started):
                return False  # not the probe: held, like everything while not closed
            self._probing = False
            if cause != self.cause:
                return True  # the probe failed its own way: the prompt's fault
            self._cooldown = min(self.max_cooldown_s, self._cooldown * 2)
            self._open(cause)
            return False
        self._remember(cause)
        count = Counter(self._outcomes)[cause]
        if len(self._outcomes) >= self.window and count >= self.threshold * self.window:
            self._cooldown = self.cooldown_s
            self.trips += 1
            self._open(cause)
            return False
        return True

    def success(self, started: float | None = None) -> None:
        if self.state == "open":
            return  # started before it opened: says nothing about the server now
        if self.state == "half-open":
            if self._before_probe(started):
                return  # an old request, not the probe
            self.state = "closed"
            self.cause = None
            self._cooldown = 0.0
            self._outcomes.clear()
        self._probing = False
        self._remember(None)

    def may_start(self) -> bool:
        """Whether a request may start now (one probe at a time when half-open)."""
        if self.state == "closed":
            return True
        if self.state == "open" and self.clock() - self.opened_at >= self._cooldown:
            self.state = "half-open"
            self._half_open_at = self.clock()
        if self.state == "half-open" and not self._probing:
            self._probing = True
            return True
        return False

    def seconds_to_probe(self) -> float:
        return max(0.0, self.opened_at + self._cooldown - self.clock())

    def _before_probe(self, started: float | None) -> bool:
        return started is not None and started < self._half_open_at

    def _remember(self, outcome: str | None) -> None:
        self._outcomes.append(outcome)
        while len(self._outcomes) > self.window:
            self._outcomes.popleft()

    def _open(self, cause: str) -> None:
        self.state = "open"
        self.cause = cause
        self.opened_at = self.clock()
