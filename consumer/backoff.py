"""Retry delays: exponential backoff with full jitter, capped."""

from __future__ import annotations

import random

import msgspec


class RetryPolicy(msgspec.Struct, frozen=True):
    max_attempts: int = 5
    base_s: float = 1.0
    cap_s: float = 60.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before attempt `attempt + 1` (attempt counts from 1)."""
        ceiling = min(self.cap_s, self.base_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(ceiling / 2, ceiling)

    def exhausted(self, attempt: int) -> bool:
        return attempt >= self.max_attempts
