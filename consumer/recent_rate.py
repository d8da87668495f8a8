"""Rates over the last few minutes, from the cumulative totals a worker
commits. `status` needs them because lifetime averages never fall: a fleet
that stopped an hour ago still shows its average speed."""

from __future__ import annotations

from collections import deque

import msgspec


class Rates(msgspec.Struct, frozen=True):
    requests_per_s: float = 0.0
    tokens_per_s: float = 0.0
    window_s: float = 0.0  # the span the rates cover (shorter at start)


class RecentRate:
    """Samples of (time, requests, tokens) totals; the rate is the change
    from the oldest sample still inside the window (or the last one before
    it) to the newest."""

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int, int]] = deque()

    def add(self, at: float, requests: int, tokens: int) -> None:
        self._samples.append((at, requests, tokens))
        # Keep one sample at or before the window's start, so the span covers it.
        while len(self._samples) >= 2 and self._samples[1][0] <= at - self.window_s:
            self._samples.popleft()

    def rates(self, at: float, requests: int, tokens: int) -> Rates:
        """The rates if (at, requests, tokens) were the newest sample."""
        start = next((s for s in reversed(self._samples) if s[0] <= at - self.window_s),
                     self._samples[0] if self._samples else None)
        if start is None or at <= start[0]:
            return Rates()
        span = at - start[0]
        return Rates(requests_per_s=max(0, requests - start[1]) / span,
                     tokens_per_s=max(0, tokens - start[2]) / span, window_s=span)
