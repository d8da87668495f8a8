"""Read a compacted, single-partition topic to its end as a key -> value map.

Used for the run registry and the progress topic. Reads `read_committed`, so
values written inside aborted transactions never count.

"The end" is where every transaction open when the read starts is decided.
The last stable offset alone is not enough: it stops at the first record of
the oldest open transaction, and a value committed after that record stays
out of sight until the transaction ends. A worker killed mid-commit leaves
its transaction open for its transaction timeout (20-30 s), so a sink
restarted beside it would read counters from before that and undercount
forever. So a read waits (bounded) for the last stable offset to pass the
high watermark seen at its start. Callers that only look (status) may take
what is decided after a short wait instead (`stale_ok`).

A read of a few keys among many (`few_keys`: a member's own counters)
first looks at the undecided records themselves (`read_uncommitted`): when
none of them has a kept key, what is decided is already final for those
keys and the read does not wait. A fresh member starting beside one that
died mid-commit would otherwise wait out that member's transaction timeout
for nothing. Reads that keep (nearly) every key skip that look: it would
find one of theirs every time and only cost a second read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from tokenmill.kafka import clients, committed
from tokenmill.settings import Settings

READ_TIMEOUT_S = 60.0
# Longer than any transaction timeout of ours: an open transaction whose
# owner died is aborted by the coordinator by then.
SETTLE_TIMEOUT_S = 90.0
SETTLE_POLL_S = 0.05


class Unsettled(TimeoutError):
    """A transaction open on the topic when the read started is still not decided."""


def read_to_end(settings: Settings, topic: str, keep: Callable[[str], bool] | None = None,
                *, settle_s: float = SETTLE_TIMEOUT_S, stale_ok: bool = False,
                few_keys: bool = False, admin: AdminClient | None = None) -> dict[str, bytes]:
    """The latest committed value of every key (`keep`: of the keys it accepts).

    Waits up to `settle_s` for transactions open at the start to be decided;
    then raises Unsettled, or with `stale_ok` reads what is decided so far.
    With `few_keys`, waits only when an undecided record has a kept key.
    `admin`: a client of the caller's for the offset lookups (else a new one)."""
    tp = TopicPartition(topic, 0)
    # `is None`: a client with nothing queued is falsy (confluent-kafka gives it a length)
    admin = admin if admin is not None else clients.admin(settings)
    undecided_matters = (partial(_has_key_between, settings, topic, keep=keep)
                         if few_keys and keep is not None else None)
    bounds = committed.partition_bounds(admin, topic, 0, settings.connect_timeout_s)
    end = settled_end(admin, tp, settings.connect_timeout_s, settle_s=settle_s,
                      stale_ok=stale_ok, undecided_matters=undecided_matters, bounds=bounds)
    values: dict[str, bytes] = {}
    if end <= bounds.start:
        return values
    start = bounds.start
    consumer = clients.consumer(settings, "tokenmill.kafka.compacted-reader",
                                      committed.READER_CONFIG)
    try:
        for message in committed.read_partition(consumer, topic, 0, end, READ_TIMEOUT_S,
                                                start=start):
            _take(values, keep, message)
    finally:
        consumer.close()
    return values


def _take(values: dict[str, bytes], keep: Callable[[str], bool] | None,
          message: Message) -> None:
    """A record into the key -> value map: a kept key's latest value, or
    its removal (a tombstone)."""
    key = (message.key() or b"").decode()
    if keep is not None and not keep(key):
        return
    value = message.value()
    if value is None:
        values.pop(key, None)
    else:
        values[key] = value


class Tail:
    """`read_to_end` for a reader that looks again and again (a service's
    done check, every few seconds): one consumer, kept, that resumes where
    the last look ended, with what it has read kept as the key -> value
    map. A look reads what was written since the one before, not the whole
    topic: at the seed run's size a run's progress topic held 7.5 MB that
    every worker read again every 3 s. Looks take what is decided
    (`stale_ok`): records past an undecided transaction are read by a
    later look. Not thread-safe: one caller at a time."""

    def __init__(self, settings: Settings, topic: str, keep: Callable[[str], bool] | None = None,
                 *, settle_s: float) -> None:
        self._settings, self._topic, self._keep, self._settle_s = settings, topic, keep, settle_s
        self._values: dict[str, bytes] = {}
        self._next: int | None = None  # the offset the next look reads from
        self._consumer: Consumer | None = None

    def look(self) -> dict[str, bytes]:
        """The latest decided value of every kept key."""
        admin = clients.admin(self._settings)
        timeout_s = self._settings.connect_timeout_s
        bounds = committed.partition_bounds(admin, self._topic, 0, timeout_s)
        end = settled_end(admin, TopicPartition(self._topic, 0), timeout_s,
                          settle_s=self._settle_s, stale_ok=True, bounds=bounds)
        if self._next is None:
            self._next = bounds.start
        if end > self._next:
            if self._consumer is None:
                self._consumer = clients.consumer(
                    self._settings, "tokenmill.kafka.compacted-reader", committed.READER_CONFIG)
            for message in committed.read_partition(self._consumer, self._topic, 0, end,
                                                    READ_TIMEOUT_S, start=self._next):
                _take(self._values, self._keep, message)
            self._next = end
        return dict(self._values)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def settled_end(admin: AdminClient, tp: TopicPartition, timeout_s: float, *,
                settle_s: float, stale_ok: bool = False,
                undecided_matters: Callable[[int, int], bool] | None = None,
                clock: Callable[[], float] = time.monotonic,
                bounds: committed.Bounds | None = None) -> int:
    """An offset below which every record is decided and which is at or past
    every record written before the call (of the records that matter:
    `undecided_matters(stable, end)`, asked once, says whether the undecided
    range holds any). `bounds`: the partition's, asked since the call began
    (else asked now). Its high watermark and last stable offset are asked
    together: a stable offset at or past the high watermark means no record
    before the later of the two answers was undecided, whichever came first."""
    if bounds is None:
        bounds = committed.partition_bounds(admin, tp.topic, tp.partition, timeout_s)
    target, stable = bounds.high, bounds.stable
    deadline = clock() + settle_s
    asked = False
    while True:
        if stable >= target:
            return stable
        if undecided_matters is not None and not asked:
            asked = True
            if not undecided_matters(stable, target):
                return stable
        if clock() >= deadline:
            if stale_ok:
                return stable
            raise Unsettled(
                f"{tp.topic}: a transaction open since offset {stable} is still undecided "
                f"after {settle_s:.0f}s (end {target}); its producer's transaction timeout "
                "should have aborted it")
        time.sleep(SETTLE_POLL_S)
        stable = last_stable_offset(admin, tp, timeout_s)


def last_stable_offset(admin: AdminClient, tp: TopicPartition, timeout_s: float) -> int:
    """The read_committed end of a partition. A just-created topic may not
    have a leader yet: retry briefly."""
    return committed.last_stable_offsets(admin, tp.topic, [tp.partition], timeout_s)[tp.partition]


def _has_key_between(settings: Settings, topic: str, start: int, end: int,
                     keep: Callable[[str], bool]) -> bool:
    """Whether any record in [start, end), decided or not, has a kept key."""
    consumer = clients.consumer(settings, "tokenmill.kafka.compacted-reader",
                                      {**committed.READER_CONFIG,
                                       "isolation.level": "read_uncommitted"})
    try:
        return any(keep((message.key() or b"").decode()) for message in
                   committed.read_partition(consumer, topic, 0, end, READ_TIMEOUT_S,
                                            start=start))
    finally:
        consumer.close()
