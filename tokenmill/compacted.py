"""Read a compacted, single-partition topic to its end as a key -> value map.

Used for the run registry and the progress topic. Reads `read_committed`, so
values written inside aborted transactions never count. "The end" is the last
stable offset when reading starts: everything below it is decided, and a
transaction still open (say, of a worker killed mid-commit) never makes a
reader wait. The consumer position moves past transaction markers, so reaching
the end needs no offset counting.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tokenmill import kafka_clients
from tokenmill.settings import Settings

READ_TIMEOUT_S = 60.0
# Committed records below the end arrive at once; if none comes for this long,
# what is left below the end can only be markers or aborted records, which
# librdkafka may not step the position over. Stop there instead of waiting.
IDLE_END_S = 2.0


def read_to_end(
    settings: Settings, topic: str, keep: Callable[[str], bool] | None = None
) -> dict[str, bytes]:
    tp = TopicPartition(topic, 0)
    end = last_stable_offset(kafka_clients.admin(settings), tp, settings.connect_timeout_s)
    values: dict[str, bytes] = {}
    if end <= 0:
        return values
    consumer = kafka_clients.consumer(settings, "tokenmill.compacted-reader")
    try:
        consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
        deadline = time.monotonic() + READ_TIMEOUT_S
        last_data = time.monotonic()
        while _position(consumer, tp) < end:
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"could not read {topic} to offset {end} in {READ_TIMEOUT_S}s")
            idle = now - last_data
            if idle > IDLE_END_S and (_position(consumer, tp) >= 0 or idle > 3 * IDLE_END_S):
                break
            messages = consumer.consume(num_messages=1000, timeout=0.2)
            if messages:
                last_data = time.monotonic()
            for message in messages:
                if message.error():
                    raise RuntimeError(f"reading {topic}: {message.error()}")
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


def _position(consumer: Consumer, tp: TopicPartition) -> int:
    offset = consumer.position([tp])[0].offset
    return offset if offset >= 0 else -1


def last_stable_offset(admin: AdminClient, tp: TopicPartition, timeout_s: float) -> int:
    """The read_committed end of a partition. A just-created topic may not
    have a leader yet: retry briefly."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            futures = admin.list_offsets({tp: OffsetSpec.latest()},
                                         isolation_level=IsolationLevel.READ_COMMITTED,
                                         request_timeout=timeout_s)
            return int(futures[tp].result().offset)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
