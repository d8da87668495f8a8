"""Read a compacted, single-partition topic to its end as a key -> value map.

Used for the run registry and the progress topic. Reads `read_committed`, so
values written inside aborted transactions never count. "The end" is the high
watermark when reading starts; the consumer position moves past transaction
markers, so reaching it needs no offset counting. Transactions still open
below it are waited for (they end within the transaction timeout).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tokenmill import kafka_clients
from tokenmill.settings import Settings

WAIT_FOR_OPEN_TRANSACTIONS_S = 90.0


def read_to_end(
    settings: Settings, topic: str, keep: Callable[[str], bool] | None = None
) -> dict[str, bytes]:
    consumer = kafka_clients.consumer(settings, "tokenmill.compacted-reader")
    values: dict[str, bytes] = {}
    try:
        tp = TopicPartition(topic, 0)
        low, high = _watermarks(consumer, tp, settings.connect_timeout_s)
        if high <= low:
            return values
        consumer.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + WAIT_FOR_OPEN_TRANSACTIONS_S
        while True:
            for message in consumer.consume(num_messages=1000, timeout=0.2):
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
            if consumer.position([tp])[0].offset >= high:
                return values
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to offset {high}: a transaction "
                                   f"stayed open for {WAIT_FOR_OPEN_TRANSACTIONS_S:.0f}s")
    finally:
        consumer.close()


def _watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """A just-created topic may not have a leader yet: retry briefly."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
            return int(low), int(high)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
