"""Read a compacted, single-partition topic to its end as a key -> value map.

Used for the run registry and the progress topic. Reads `read_committed`, so
values written inside aborted transactions never count; the end is the last
stable offset, signalled by librdkafka's partition-EOF event (offsets are
never counted: transaction markers take slots).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import KafkaError, TopicPartition

from tokenmill import kafka_clients
from tokenmill.settings import Settings


def read_to_end(
    settings: Settings, topic: str, keep: Callable[[str], bool] | None = None
) -> dict[str, bytes]:
    consumer = kafka_clients.consumer(
        settings, "tokenmill.compacted-reader", {"enable.partition.eof": True}
    )
    values: dict[str, bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, 0, -2)])  # OFFSET_BEGINNING
        deadline = time.monotonic() + max(30.0, settings.connect_timeout_s * 3)
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return values
                raise RuntimeError(f"reading {topic}: {error}")
            key = (message.key() or b"").decode()
            if keep is not None and not keep(key):
                continue
            value = message.value()
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        raise TimeoutError(f"could not read {topic} to its end")
    finally:
        consumer.close()
