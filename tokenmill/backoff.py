"""Exponential backoff, capped: the one delay formula of every retry loop
(transaction steps, start-up waits, generation retries).

No jitter here: a loop that wants its retries spread out (the generation
retries of many prompts at once, consumer/backoff.py) draws within the
delay itself; the others retry one call on their own and need none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """`first_s` before the second attempt, doubling with each attempt after
    it, never above `cap_s`."""

    first_s: float
    cap_s: float

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt + 1` (attempts count from
        1): min(cap_s, first_s * 2 ** (attempt - 1)), exactly (doubling a
        float is exact), without overflowing however many attempts."""
        try:
            grown = math.ldexp(self.first_s, attempt - 1)
        except OverflowError:  # far past any cap
            grown = math.inf
        return min(self.cap_s, grown)
