"""Fault knobs: which request fails, stalls, aborts, comes back empty or trivial.

Transient faults (error, stall, abort) are drawn from a hash of the seed, the
prompt and how many times this server has seen that prompt, so a retry of the
same prompt gets a fresh draw and can succeed, while a rerun of the same
request sequence sees the same faults. Content faults (empty, trivial) are a
pure function of the prompt: a retry gets the same bad answer, as a model
would give.
"""

from __future__ import annotations

import enum
import hashlib

from sglang_sim.config import SimulatorConfig

_MAX_TRACKED = 1_000_000


class Transient(enum.Enum):
    NONE = "none"
    ERROR = "error"
    STALL = "stall"
    ABORT = "abort"


class ContentFault(enum.Enum):
    NONE = "none"
    EMPTY = "empty"
    TRIVIAL = "trivial"


def unit(digest: bytes, slot: int) -> float:
    """Uniform number in [0, 1) from 4 bytes of `digest` at `slot` (0..7)."""
    i = (slot % 8) * 4
    return int.from_bytes(digest[i : i + 4], "big") / 4294967296.0


def content_fault(config: SimulatorConfig, u: float) -> ContentFault:
    """Empty / trivial answers from one uniform draw of the prompt hash."""
    if u < config.empty_rate:
        return ContentFault.EMPTY
    if u < config.empty_rate + config.trivial_rate:
        return ContentFault.TRIVIAL
    return ContentFault.NONE


def transient_fault(config: SimulatorConfig, u: float) -> Transient:
    """Error / stall / abort from one uniform draw (rates stack, in that order)."""
    edge = config.error_rate
    if u < edge:
        return Transient.ERROR
    edge += config.stall_rate
    if u < edge:
        return Transient.STALL
    edge += config.abort_rate
    if u < edge:
        return Transient.ABORT
    return Transient.NONE


class FaultInjector:
    """Per-server state for transient faults and the crash counter."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self._attempts: dict[bytes, int] = {}
        self.any_transient = (config.error_rate + config.stall_rate + config.abort_rate) > 0
        self.chat_requests = 0

    def draw(self, key: bytes) -> tuple[Transient, float]:
        """Fault for this attempt at prompt `key`, plus a spare uniform draw."""
        if not self.any_transient:
            return Transient.NONE, 0.5
        attempt = self._attempts.get(key, 0)
        if len(self._attempts) >= _MAX_TRACKED:
            self._attempts.clear()
        self._attempts[key] = attempt + 1
        seed = self.config.seed.to_bytes(8, "big", signed=True)
        digest = hashlib.blake2b(
            key + seed + attempt.to_bytes(4, "big"), digest_size=16
        ).digest()
        return transient_fault(self.config, unit(digest, 0)), unit(digest, 1)

    def should_crash(self) -> bool:
        """Count a chat request; True when it is one past `crash_after`."""
        self.chat_requests += 1
        limit = self.config.crash_after
        return limit is not None and self.chat_requests > limit
