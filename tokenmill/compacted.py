"""Read a compacted, single-partition topic to its end as a key -> value map.

Used for the run registry and the progress topic. Reads `read_committed`, so
values written inside aborted transactions never count. "The end" is the last
stable offset when reading starts: everything below it is decided, and a
transaction still open (say, of a worker killed mid-commit) never makes a
reader wait. The consumer position moves past transaction markers, so reaching
the end needs no offset counting.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from tokenmill import committed, kafka_clients
from tokenmill.settings import Settings

READ_TIMEOUT_S = 60.0


def read_to_end(
    settings: Settings, topic: str, keep: Callable[[str], bool] | None = None
) -> dict[str, bytes]:
    tp = TopicPartition(topic, 0)
    admin = kafka_clients.admin(settings)
    end = last_stable_offset(admin, tp, settings.connect_timeout_s)
    values: dict[str, bytes] = {}
    if end <= 0:
        return values
    start = committed.start_offsets(admin, topic, [0], settings.connect_timeout_s)[0]
    consumer = kafka_clients.consumer(settings, "tokenmill.compacted-reader",
                                      committed.READER_CONFIG)
    try:
        for message in committed.read_partition(consumer, topic, 0, end, READ_TIMEOUT_S,
                                                start=start):
            key = (message.key() or b"").decode()
            if keep is not None and not keep(key):
                continue
            value = message.value()
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
    finally:
        consumer.close()
    return values


def last_stable_offset(admin: AdminClient, tp: TopicPartition, timeout_s: float) -> int:
    """The read_committed end of a partition. A just-created topic may not
    have a leader yet: retry briefly."""
    return committed.last_stable_offsets(admin, tp.topic, [tp.partition], timeout_s)[tp.partition]
