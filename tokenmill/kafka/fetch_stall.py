"""A consumer that stopped fetching: owned partitions silent for minutes
while committed records wait past what the consumer last heard of them.

librdkafka can keep a partition assigned after a broker restart and never
fetch from it again (confluentinc/librdkafka#5153, open). A sink in
tests/liveness/test_broker_faults.py sat in that state for 15 minutes with
the run's last records waiting: no call was outstanding, its loop beat, and
nothing timed out. Only two facts together show it: no record and no
end-of-partition mark came for a partition for `limit_s` (a fetching
consumer hears one or the other within a fetch round-trip), and the
partition's committed end (its last stable offset, what a `read_committed`
reader can reach) is past the offset the consumer would read next. A
partition whose end is held back by a transaction left open upstream is not
stalled: the consumer is where it can be. Crash-only: the service exits
with one line and its supervisor restarts it from committed state.

`Silence` is the pure part: it is told what the consumer heard, and says
which partitions have been silent long enough to ask the broker about;
`stalled` decides from the broker's answer, and a verdict stands only when
the next look (a check later) finds the same partition stalled at the same
offset. `committed_ends` and `group_committed` ask the broker.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tokenmill.kafka import committed as committed_reads
from tokenmill.kafka.transactions import KafkaFatal

# Silent this long, over at least MIN_POLLS polls, before the broker is
# asked: a loop blocked elsewhere (an upload it waits for) is not a stall.
LIMIT_S = 60.0
MIN_POLLS = 20
# The longest wait between two looks at the silent partitions.
LOOK_EVERY_S = 10.0


def look_interval(limit_s: float) -> float:
    """Seconds between a service's looks at its silent partitions (pure). A
    stall stands at the second look that finds it: looking every half limit
    (at most every LOOK_EVERY_S) ends a stalled service within about twice
    its limit, where a fixed 10 s made a 5 s limit take 20 s."""
    return min(LOOK_EVERY_S, limit_s / 2)


K = TypeVar("K", bound=Hashable)  # a partition: its number, or (slot, topic, partition)


class FetchStalled(KafkaFatal):
    """The consumer stopped fetching partitions that have records for it."""


@dataclass
class _Heard:
    at: float  # when a record or an end mark last came (or the partition was (re)started)
    polls: int  # polls since then
    next_offset: int | None  # the offset it would read next; None: nothing heard yet


class Silence(Generic[K]):
    """Per owned partition, when the consumer last heard of it and where it
    would read next. `now` is any monotonic clock, the same for all calls."""

    def __init__(self, limit_s: float = LIMIT_S, min_polls: int = MIN_POLLS) -> None:
        self.limit_s = limit_s
        self.min_polls = min_polls
        self._heard: dict[K, _Heard] = {}
        self._suspected: dict[K, int] = {}  # the last verdict: partition -> would read

    def owned(self, partitions: Iterable[K], now: float) -> None:
        """Assigned: read from the group's committed offset, not known here."""
        for partition in partitions:
            self._heard[partition] = _Heard(now, 0, None)

    def dropped(self, partitions: Iterable[K]) -> None:
        for partition in partitions:
            self._heard.pop(partition, None)

    def restarted(self, partition: K, offset: int, now: float) -> None:
        """The partition is read again from `offset` (a seek)."""
        if partition in self._heard:
            self._heard[partition] = _Heard(now, 0, offset)

    def record(self, partition: K, offset: int, now: float) -> None:
        if partition in self._heard:
            self._heard[partition] = _Heard(now, 0, offset + 1)

    def end(self, partition: K, offset: int, now: float) -> None:
        """An end-of-partition mark: nothing more to read at `offset`, now."""
        if partition in self._heard:
            self._heard[partition] = _Heard(now, 0, offset)

    def polled(self) -> None:
        for heard in self._heard.values():
            heard.polls += 1

    def hush(self, now: float) -> None:
        """Not fetching on purpose just now (paused, or the buffer full):
        silence from here on counts from now."""
        for heard in self._heard.values():
            heard.at, heard.polls = now, 0

    def silent(self, now: float) -> dict[K, int | None]:
        """The partitions silent for `limit_s` over `min_polls` polls: the
        offset each would read next (None: nothing heard since assigned)."""
        return {p: h.next_offset for p, h in self._heard.items()
                if now - h.at >= self.limit_s and h.polls >= self.min_polls}

    def confirm(self, verdict: Mapping[K, tuple[int, int]]) -> dict[K, tuple[int, int]]:
        """The partitions of `verdict` already stalled at the same offset in
        the previous one. Records committed a moment before the broker was
        asked may not be fetched yet: only a second look, a check later,
        tells a client that stopped from one about to hear them."""
        confirmed = {p: v for p, v in verdict.items() if self._suspected.get(p) == v[0]}
        self._suspected = {p: at for p, (at, _end) in verdict.items()}
        return confirmed

    def silent_for(self, partition: K, now: float) -> float:
        heard = self._heard.get(partition)
        return 0.0 if heard is None else now - heard.at


def stalled(silent: Mapping[K, int | None], ends: Mapping[K, int],
            committed: Mapping[K, int]) -> dict[K, tuple[int, int]]:
    """Of the `silent` partitions (next offset, or None: the group's
    `committed` offset), those whose committed end in `ends` is past where
    the consumer would read: partition -> (would read, end). A partition
    missing from `ends` or `committed` (the broker did not say) is not
    judged."""
    verdict: dict[K, tuple[int, int]] = {}
    for partition, next_offset in silent.items():
        at = committed.get(partition) if next_offset is None else next_offset
        end = ends.get(partition)
        if at is None or end is None or at < 0:
            continue
        if end > at:
            verdict[partition] = (at, end)
    return verdict


def describe(topic: str, verdict: Mapping[Any, tuple[int, int]], silent_s: float) -> str:
    """The one line a stalled service exits with (`verdict` keys: what names
    a partition there)."""
    waiting = ", ".join(f"{p} ({end - at} records from offset {at})"
                        for p, (at, end) in sorted(verdict.items(), key=lambda kv: str(kv[0])))
    return (f"the Kafka consumer stopped fetching {topic}: nothing came for {silent_s:.0f}s "
            f"from partitions with committed records waiting: {waiting} (librdkafka after a "
            "broker restart); exiting so that the supervisor restarts it from committed state")


def committed_ends(admin: Any, partitions: Iterable[tuple[str, int]],
                   timeout_s: float = 10.0) -> dict[tuple[str, int], int]:
    """Each (topic, partition)'s committed end: its last stable offset, what
    a `read_committed` reader can reach. Raises what the client raises."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    ends: dict[tuple[str, int], int] = {}
    for topic, wanted in by_topic.items():
        for p, end in committed_reads.last_stable_offsets(admin, topic, wanted, timeout_s).items():
            ends[(topic, p)] = end
    return ends


def group_committed(admin: Any, group: str, partitions: Iterable[tuple[str, int]],
                    timeout_s: float = 10.0) -> dict[tuple[str, int], int]:
    """The group's committed offsets of the partitions that have one."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    wanted = [TopicPartition(t, p) for t, p in partitions]
    offsets = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, wanted)], request_timeout=timeout_s)
    return {(tp.topic, tp.partition): tp.offset
            for tp in offsets[group].result(timeout=timeout_s).topic_partitions
            if tp.error is None}
