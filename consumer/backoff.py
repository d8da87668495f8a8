"""Retry delays of a prompt's generation: exponential backoff, capped
(tokenmill/backoff.py), with jitter: drawn from the upper half of the
delay, so prompts that failed together do not all retry at once."""

from __future__ import annotations

import random

import msgspec

from tokenmill.backoff import Backoff


class RetryPolicy(msgspec.Struct, frozen=True):
    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt `attempt + 1` (attempt counts from 1)."""
        ceiling = Backoff(first_s=self.base_s, cap_s=self.cap_s).delay(attempt)
        return (rng or random).uniform(ceiling / 2, ceiling)

    def exhausted(self, attempt: int) -> bool:
        return attempt >= self.max_attempts
