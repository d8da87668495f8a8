"""Handing a partition to another worker without throwing its requests away.

A donated partition's requests in flight are lost the moment its slot
closes: the new owner redoes them from the committed offset. On a slow GPU
that is most of its work in progress (a 10 s request, 8 of them per
partition). So a donating slot first drains, briefly: the worker starts no
new request on its partitions, keeps its GPU busy with its other
partitions, commits the slot's results as they finish, and closes the slot
once none is in flight or when the drain limit passes.
"""

from __future__ import annotations

from collections.abc import Callable


def drain_limit_s(latency_s: float, *, cap_s: float = 3.0) -> float:
    """How long a donating slot may drain: its requests about to finish are
    worth waiting for, the rest are not. A full drain takes a request
    latency (20 s for a long answer on a slow GPU), while the receiver
    idles and the fleet makes no other move; so at most `cap_s` (one fleet
    round), and never longer than the worker's request latency."""
    return min(cap_s, latency_s)


class Handovers:
    """The worker's slots being drained before they close, with deadlines."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def __contains__(self, slot: str) -> bool:
        return slot in self._until

    def start(self, slot: str, now: float, limit_s: float) -> None:
        self._until.setdefault(slot, now + limit_s)

    def due(self, now: float, in_flight: Callable[[str], int]) -> list[tuple[str, bool]]:
        """Slots to close now, each with whether it drained (False: its limit
        passed with requests still in flight); they leave the set."""
        out = []
        for slot, until in list(self._until.items()):
            left = in_flight(slot)
            if left == 0 or now >= until:
                del self._until[slot]
                out.append((slot, left == 0))
        return out

    def clear(self) -> None:
        self._until.clear()
