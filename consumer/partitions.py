"""What a worker holds for one partition it owns: fetched prompts waiting
for a request slot, requests in flight, finished results behind the
watermark, and what it committed.

A partition revoked from one of the worker's slots is *parked* for a moment
instead of dropped: when another slot of the same worker gets it next (the
worker splitting its slots) and nobody committed anything for it in
between, its requests in flight and waiting results carry on; otherwise
they are dropped and counted as wasted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from consumer.watermark import Watermark
from schemas import PromptRecord
from schemas.completion import CompletionRecord
from schemas.turn import TurnRecord

# What a worker reads: a prompt, or (`regenerate-turns`) a conversation
# between two turns; and what it commits for one: a result, or the next turn.
Input = PromptRecord | TurnRecord
Output = CompletionRecord | TurnRecord


@dataclass
class PartitionState:
    partition: int
    slot: str  # the member (client id) that owns it
    start_offset: int | None = None  # committed offset when it was assigned (None: unknown)
    watermark: Watermark[Output] = field(default_factory=Watermark)
    queue: deque[tuple[int, Input]] = field(default_factory=deque)
    tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    retries: int = 0  # retries of results not committed yet
    committed: int | None = None  # the input offset this worker last committed
    last_fetched: int | None = None
    parked_until: float | None = None  # monotonic deadline while parked
    topic: str = ""  # the input topic (the prompts, or a regenerate-turns run's turns)

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def parked(self) -> bool:
        return self.parked_until is not None

    def committed_offset(self) -> int | None:
        """The group's committed offset as this worker last knew it."""
        return self.committed if self.committed is not None else self.start_offset

    def next_fetch(self) -> int | None:
        return None if self.last_fetched is None else self.last_fetched + 1

    def unfinished(self) -> int:
        """Work that would be thrown away if the partition moved now."""
        return len(self.tasks) + self.watermark.waiting + self.watermark.ready_count()

    def cancel(self) -> int:
        """Cancel everything in flight; returns how many requests that was."""
        for task in self.tasks.values():
            task.cancel()
        count = len(self.tasks)
        self.tasks.clear()
        return count


def can_resume(parked: PartitionState, committed_now: int | None) -> bool:
    """A parked partition may carry on under a new slot only if the group's
    committed offset is still the one it knew: nobody committed in between."""
    if parked.next_fetch() is None:
        return False
    known = parked.committed_offset()
    if committed_now is None or committed_now < 0:
        return known is None
    return known == committed_now
