"""Which partitions a worker holds, each under the slot (group member) that
holds it, and the ones parked between two of its slots.

A worker runs several members of the group (consumer/membership.py), and
their rebalance callbacks and fetched records arrive independently: an old
slot may hear that it lost a partition, or deliver a last fetched record
of it, after the group gave the partition to another slot of the same
worker. So every state lives under the slot that holds it, and every call
names its slot: a slot only ever reaches its own states. The one move
between slots is an assignment: the group's word that the partition is the
new slot's now, which drops whatever an older slot still held of it (that
slot lost it). (Keyed by partition alone, an old slot's late loss dropped
the new slot's state, its records were ignored while its position moved on,
and 246 of 6,000 prompts were never generated.)

A revoked partition whose requests are in flight is *parked* for `park_s`
instead of dropped: the worker's next slot resumes it when nobody committed
in between (consumer/partitions.py `can_resume`); otherwise it is dropped
and its work counted as wasted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from confluent_kafka import TopicPartition

from consumer.metrics import ConsumerMetrics
from consumer.partitions import PartitionState, can_resume
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")

Drop = Literal["revoked", "lost", "moved", "shutdown"]
Key = tuple[str, int]  # (input topic, partition)


def keys_of(partitions: Iterable[TopicPartition]) -> list[Key]:
    return [(tp.topic, tp.partition) for tp in partitions]


class Ownership:
    """Parameters: `prompts_topic` (how partitions are labelled), `park_s`,
    `metrics` (assigned, in flight, wasted), `clock` (monotonic seconds)."""

    def __init__(self, *, prompts_topic: str, park_s: float, metrics: ConsumerMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prompts_topic = prompts_topic
        self.park_s = park_s
        self.metrics = metrics
        self.clock = clock
        self._held: dict[str, dict[Key, PartitionState]] = {}  # slot -> its partitions
        self._parked: dict[Key, PartitionState] = {}
        self.wasted: dict[str, int] = {}  # requests thrown away, by reason

    # -- what is held ------------------------------------------------------------

    def states(self) -> list[PartitionState]:
        """Every held (not parked) partition's state."""
        return [state for held in self._held.values() for state in held.values()]

    def by_key(self) -> dict[Key, PartitionState]:
        return {key: state for held in self._held.values() for key, state in held.items()}

    def of_slot(self, slot: str, partitions: Iterable[TopicPartition]) -> list[PartitionState]:
        """The states `slot` holds among `partitions` (a slot that lost a
        partition late holds nothing of it any more)."""
        held = self._held.get(slot, {})
        return [held[key] for key in keys_of(partitions) if key in held]

    def state(self, slot: str, key: Key) -> PartitionState | None:
        return self._held.get(slot, {}).get(key)

    def current(self, state: PartitionState) -> bool:
        """Whether `state` is still held or parked (not dropped)."""
        return (self._held.get(state.slot, {}).get(state.key) is state
                or self._parked.get(state.key) is state)

    @property
    def in_flight(self) -> int:
        return (sum(len(s.tasks) for s in self.states())
                + sum(len(s.tasks) for s in self._parked.values()))

    def in_flight_of(self, slot: str) -> int:
        return sum(len(s.tasks) for s in self._held.get(slot, {}).values())

    def buffered(self) -> int:
        """Fetched inputs waiting for a request slot."""
        return sum(len(s.queue) for s in self.states())

    def ready(self) -> int:
        """Results committable now."""
        return sum(s.watermark.ready_count() for s in self.states())

    def label(self, key: Key) -> int | str:
        """How logs and metric labels name an input partition: its number for
        the prompts (as always), `turns-<n>` for a regenerate-turns run's turns."""
        topic, partition = key
        return partition if topic == self.prompts_topic else f"turns-{partition}"

    def labels(self, keys: Iterable[Key]) -> list[int | str]:
        return [self.label(k) for k in sorted(keys)]

    # -- the group's callbacks -----------------------------------------------------

    def assign(self, slot: str, partitions: list[TopicPartition],
               committed: Mapping[Key, int | None]) -> None:
        """`slot` now holds `partitions`; a parked one resumes (its fetch
        position is set on its TopicPartition), others start at `committed`."""
        held = self._held.setdefault(slot, {})
        resumed = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            for old_slot, old in self._held.items():
                stale = old.pop(key, None)
                if stale is not None:  # still held by a slot that lost it
                    log.warning("partition moved between this worker's slots before the old "
                                "one learned it; its uncommitted work is dropped",
                                partition=self.label(key), old_slot=old_slot, slot=slot)
                    self._drop(stale, "lost")
            parked = self._parked.pop(key, None)
            if parked is not None and can_resume(parked, committed.get(key)):
                parked.slot = slot
                parked.parked_until = None
                held[key] = parked
                tp.offset = parked.next_fetch() or tp.offset
                resumed.append(self.label(key))
                continue
            if parked is not None:
                self._drop(parked, "moved")
            held[key] = PartitionState(tp.partition, slot, start_offset=committed.get(key),
                                       topic=tp.topic)
        self._forget_empty()
        self.metrics.assigned.set(self._count())
        log.info("partitions assigned", slot=slot, partitions=self.labels(keys_of(partitions)),
                 resumed=resumed, owned=self.labels(self.by_key()))

    def revoke(self, slot: str, partitions: list[TopicPartition], *, park: bool) -> None:
        """`slot` gave `partitions` up (their ready results are committed
        already): those with requests in flight are parked when `park`, the
        rest dropped."""
        held = self._held.get(slot, {})
        for key in keys_of(partitions):
            state = held.pop(key, None)
            if state is None:
                continue
            if park and state.tasks:
                state.parked_until = self.clock() + self.park_s
                self._parked[key] = state
            else:
                self._drop(state, "revoked")
        self._forget_empty()
        self.metrics.assigned.set(self._count())
        log.info("partitions revoked", slot=slot, partitions=self.labels(keys_of(partitions)),
                 owned=self.labels(self.by_key()))

    def lose(self, slot: str, partitions: list[TopicPartition]) -> None:
        """`slot` lost `partitions` (its generation is gone): drop them."""
        held = self._held.get(slot, {})
        for key in keys_of(partitions):
            state = held.pop(key, None)
            if state is not None:
                self._drop(state, "lost")
        self._forget_empty()
        self.metrics.assigned.set(self._count())
        log.warning("partitions lost; their uncommitted work is dropped", slot=slot,
                    partitions=self.labels(keys_of(partitions)))

    # -- parked partitions ---------------------------------------------------------

    def expire_parked(self) -> None:
        now = self.clock()
        for key, state in list(self._parked.items()):
            if state.parked_until is not None and now >= state.parked_until:
                del self._parked[key]
                self._drop(state, "moved")

    def drop_parked(self, reason: Drop) -> None:
        for key, state in list(self._parked.items()):
            del self._parked[key]
            self._drop(state, reason)

    # -- inside --------------------------------------------------------------------

    def _count(self) -> int:
        return sum(len(held) for held in self._held.values())

    def _forget_empty(self) -> None:
        """Slots that hold nothing (closed ones, standbys) need no entry."""
        for slot in [slot for slot, held in self._held.items() if not held]:
            del self._held[slot]

    def _drop(self, state: PartitionState, reason: Drop) -> None:
        wasted = state.unfinished()
        state.cancel()
        if wasted:
            self.wasted[reason] = self.wasted.get(reason, 0) + wasted
            self.metrics.wasted.labels(reason).inc(wasted)
        self.metrics.in_flight.set(self.in_flight)
