"""Read a topic's committed records to its end, one partition after another.

Reads `read_committed`, so records of aborted transactions never appear.
"The end" of a partition is its last stable offset when reading it starts:
everything below it is decided, and a transaction still open (say, of a
worker killed mid-commit) never makes a reader wait. Partitions are read in
order, each from its start, so the same topic always yields the same records
in the same order: what redrive and export need to be deterministic.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import NamedTuple

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

# confluent-kafka re-exports its admin types without __all__, and leaves
# OffsetSpec's constructors untyped: the ignores name those two gaps.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    OffsetSpec,
)

from tokenmill.kafka import clients
from tokenmill.settings import Settings

READ_TIMEOUT_S = 600.0  # one partition; generous: a DLQ partition can hold gigabytes
BATCH = 1000
# A batch returns at BATCH records or after this wait: the last, short batch
# of every partition waits it out, the end-of-partition event in it included,
# so keep it short: at 50 ms every read of a small topic (the registry, a
# run's progress: `status` does three) took 50 ms more than its round trips.
# While records stream, batches still fill (librdkafka fetches ahead).
BATCH_WAIT_S = 0.005
# Readers that stop at the end: a fetch that finds nothing new must not sit
# at the broker for the default 500 ms each time a partition is switched; and
# a reader that streams a DLQ holds 16 MB ahead, not librdkafka's 64 MB.
# The end-of-partition event says exactly when the fetcher has passed the
# end, aborted records and transaction markers included.
READER_CONFIG = {"fetch.wait.max.ms": 10, "queued.max.messages.kbytes": 16 * 1024,
                 "enable.partition.eof": True}


def partition_count(settings: Settings, topic: str) -> int:
    metadata = clients.admin(settings).list_topics(topic, timeout=settings.connect_timeout_s)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise LookupError(f"topic {topic} does not exist at {settings.bootstrap_servers}")
    return len(found.partitions)


def last_stable_offsets(admin: AdminClient, topic: str, partitions: list[int],
                        timeout_s: float) -> dict[int, int]:
    """The read_committed end of each partition, in one request."""
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call, unused-ignore]
    return _offsets(admin, topic, partitions, latest, timeout_s)


# A ListOffsets timestamp meaning "the end": for a read_committed consumer,
# the last stable offset.
LATEST = -1


def consumer_last_stable_offsets(consumer: Consumer, topic: str, partitions: list[int],
                                 timeout_s: float) -> dict[int, int]:
    """last_stable_offsets through a read_committed consumer, for callers that
    ask often. admin.list_offsets, with a partition's leader down, makes
    librdkafka's admin worker ask for a connection to it again at every
    failed attempt, with no backoff (hundreds of connects a second, half a
    core, for as long as the broker is down; librdkafka 2.16). The
    consumer's offsets_for_times waits out the same leader quietly, then
    times out."""
    found = consumer.offsets_for_times(
        [TopicPartition(topic, p, LATEST) for p in partitions], timeout=timeout_s)
    failed = [tp for tp in found if tp.error is not None]
    if failed:
        raise KafkaException(failed[0].error)
    return {tp.partition: tp.offset for tp in found}


def high_watermarks(admin: AdminClient, topic: str, partitions: list[int],
                    timeout_s: float) -> dict[int, int]:
    """The end of each partition counting records of transactions still open."""
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call, unused-ignore]
    return _offsets(admin, topic, partitions, latest, timeout_s,
                    IsolationLevel.READ_UNCOMMITTED)


def start_offsets(admin: AdminClient, topic: str, partitions: list[int],
                  timeout_s: float) -> dict[int, int]:
    """Where each partition starts. Assigning this offset rather than
    OFFSET_BEGINNING spares librdkafka's offset reset, half a second a read."""
    earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call, unused-ignore]
    return _offsets(admin, topic, partitions, earliest, timeout_s)


class Bounds(NamedTuple):
    """A partition's offsets, asked together."""

    start: int  # where it starts
    stable: int  # its read_committed end: the last stable offset
    high: int  # its end counting records of transactions still open


def partition_bounds(admin: AdminClient, topic: str, partition: int,
                     timeout_s: float) -> Bounds:
    """A partition's start, last stable offset and high watermark: one
    metadata request and three ListOffsets in flight at once, instead of
    three of each one after another (a look at a busy broker waits for
    each)."""
    earliest = OffsetSpec.earliest()  # type: ignore[no-untyped-call, unused-ignore]
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call, unused-ignore]
    start, stable, high = _offsets_at_once(
        admin, topic, [partition],
        [(earliest, IsolationLevel.READ_COMMITTED), (latest, IsolationLevel.READ_COMMITTED),
         (latest, IsolationLevel.READ_UNCOMMITTED)], timeout_s)
    return Bounds(start[partition], stable[partition], high[partition])


def _offsets(admin: AdminClient, topic: str, partitions: list[int], spec: OffsetSpec,
             timeout_s: float,
             isolation: IsolationLevel = IsolationLevel.READ_COMMITTED) -> dict[int, int]:
    return _offsets_at_once(admin, topic, partitions, [(spec, isolation)], timeout_s)[0]


def _offsets_at_once(admin: AdminClient, topic: str, partitions: list[int],
                     asks: list[tuple[OffsetSpec, IsolationLevel]],
                     timeout_s: float) -> list[dict[int, int]]:
    """One request per ask for every partition, all in flight together. A
    just-created topic may not have its leaders yet, and a partition's leader
    may move between attempts: retry briefly. The topic's metadata is asked
    for first, each time: ListOffsets on a new client otherwise looks the
    leaders up itself, and that lookup, when it races librdkafka retiring its
    bootstrap connections, waits 1 or 3 s (12 of 90 first calls on three idle
    local brokers; 0 of 90 after a metadata request)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(KafkaException):
            admin.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
        try:
            pending = [admin.list_offsets({TopicPartition(topic, p): spec for p in partitions},
                                          isolation_level=isolation, request_timeout=timeout_s)
                       for spec, isolation in asks]
            return [{tp.partition: int(f.result().offset) for tp, f in futures.items()}
                    for futures in pending]
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # a pause between attempts, within the deadline


# What a reader cannot outwait: the topic or partition is not there, or the
# broker's ACLs refuse it (clients.refused_by_acl). Anything else a consumer
# reports mid-read (a broker restarting: NOT_COORDINATOR, transport
# failures, timed-out fetches) librdkafka retries on its own.
_FINAL_READ_ERRORS = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                      KafkaError._UNKNOWN_PARTITION, KafkaError._AUTHENTICATION}


def read_error_is_final(error: KafkaError) -> bool:
    """Whether a consumer error ends a read, rather than being waited out
    within its deadline (pure, tested directly)."""
    return (error.fatal() or error.code() in _FINAL_READ_ERRORS
            or clients.refused_by_acl(error))


def read_partition(consumer: Consumer, topic: str, partition: int, end: int,
                   timeout_s: float = READ_TIMEOUT_S, start: int = -2) -> Iterator[Message]:
    """Committed records of one partition from `start` (default: its
    beginning) to below `end`, in offset order.

    Stops only when the consumer's position or an end-of-partition event
    has reached `end`, never because records were slow to come: a reader
    that gave up early would hand a restarted service stale counters or
    checkpoints. A broker that stays away past `timeout_s` is a
    TimeoutError, not a short read. The consumer needs
    `enable.partition.eof` (READER_CONFIG)."""
    if end <= 0 or end <= start:
        return
    tp = TopicPartition(topic, partition)
    consumer.assign([TopicPartition(topic, partition, start)])
    try:
        deadline = time.monotonic() + timeout_s
        while _position(consumer, tp) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} [{partition}] to offset {end} "
                                   f"in {timeout_s:.0f}s")
            for message in consumer.consume(num_messages=BATCH, timeout=BATCH_WAIT_S):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        if read_error_is_final(error):
                            raise RuntimeError(f"reading {topic}: {error}")
                        continue  # the client retries it; the deadline bounds the wait
                    if message.partition() == partition and offset_of(message) >= end:
                        return
                    continue
                if offset_of(message) >= end:  # committed after reading started
                    return
                yield message
    finally:
        consumer.unassign()


def read_topic(settings: Settings, topic: str) -> Iterator[Message]:
    """Every committed record of the topic, partition 0 first, each in offset order."""
    count = partition_count(settings, topic)
    admin = clients.admin(settings)
    partitions = list(range(count))
    ends = last_stable_offsets(admin, topic, partitions, settings.connect_timeout_s)
    starts = start_offsets(admin, topic, partitions, settings.connect_timeout_s)
    consumer = clients.consumer(settings, f"{topic}.reader", READER_CONFIG)
    try:
        for partition in partitions:
            yield from read_partition(consumer, topic, partition, ends[partition],
                                      start=starts[partition])
    finally:
        consumer.close()


# confluent-kafka types a message's partition, offset and value Optional: a
# message built to be produced has no partition or offset yet, and a
# tombstone has no value. Records and end-of-partition events that a
# consumer returns have a partition and an offset, and tokenmill's topics hold
# no tombstones: these say so once, and fail loudly if that ever changes.

def partition_of(message: Message) -> int:
    partition = message.partition()
    if partition is None:
        raise ValueError("a consumed message without a partition")
    return partition


def offset_of(message: Message) -> int:
    offset = message.offset()
    if offset is None:
        raise ValueError("a consumed message without an offset")
    return offset


def value_of(message: Message) -> bytes:
    value = message.value()
    if value is None:
        raise ValueError(f"a tombstone at offset {message.offset()} of {message.topic()}")
    return value


def header(message: Message, name: str) -> bytes | None:
    """The value of the first header called `name` (None: there is none).
    A consumed record's headers are a list of (name, bytes) pairs;
    confluent-kafka's type also allows what produce accepts (a dict, str)."""
    headers = message.headers() or ()
    pairs = headers.items() if isinstance(headers, dict) else headers
    value = next((value for key, value in pairs if key == name), None)
    return value.encode() if isinstance(value, str) else value


def _position(consumer: Consumer, tp: TopicPartition) -> int:
    offset = consumer.position([tp])[0].offset
    return offset if offset >= 0 else -1
