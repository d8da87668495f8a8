"""Test-side Kafka access through kafka-python: a client that shares none of
tokenmill's code, so what it reads is what the system really wrote."""

from __future__ import annotations

import time
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


def read_all(bootstrap: str, topic: str, *, committed_only: bool = True,
             timeout_s: float = 30.0, security: dict[str, Any] | None = None) -> list[Any]:
    """Every record of `topic` up to its current end, read with
    `read_committed` (or `read_uncommitted`) from the beginning.
    `security`: kafka-python's security settings (SASL, TLS), if any."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed" if committed_only else "read_uncommitted",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=1000,
        **(security or {}),
    )
    try:
        partitions = [TopicPartition(topic, p)
                      for p in sorted(_partitions(consumer, topic, security))]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)  # last stable offset under read_committed
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(consumer.position(tp) >= ends[tp] for tp in partitions):
                break
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
        else:
            raise TimeoutError(f"could not read {topic} to its end in {timeout_s}s")
        return records
    finally:
        consumer.close()


def _partitions(consumer: KafkaConsumer, topic: str,
                security: dict[str, Any] | None = None) -> set[int]:
    """Every partition of the topic, from the broker's topic description
    (client metadata can arrive partial for a topic just created)."""
    admin = KafkaAdminClient(bootstrap_servers=consumer.config["bootstrap_servers"],
                             **(security or {}))
    try:
        for _ in range(50):
            described = admin.describe_topics([topic])
            partitions = {p["partition_index"] for d in described for p in d.get("partitions", [])}
            if partitions and not any(d.get("error_code") for d in described):
                return partitions
            time.sleep(0.1)  # poll of a wait loop
    finally:
        admin.close()
    raise LookupError(f"topic {topic} not found")


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p))
                for p in sorted(_partitions(consumer, topic))}
    finally:
        consumer.close()
