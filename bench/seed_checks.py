"""What bench/bench_seed_run.py reads after (and beside) a run, with clients
that share no code with tokenmill: kafka-python for topics, boto3 for S3,
the broker's own data directories for topic sizes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient


def _partitions(bootstrap: str, topic: str) -> list[int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        for _ in range(50):
            described = admin.describe_topics([topic])
            found = sorted({p["partition_index"] for d in described
                            for p in d.get("partitions", [])})
            if found and not any(d.get("error_code") for d in described):
                return found
            time.sleep(0.1)  # poll of a wait loop
    finally:
        admin.close()
    raise LookupError(f"topic {topic} not found")


def stream_values(bootstrap: str, topic: str, timeout_s: float = 1800.0) -> Iterator[bytes]:
    """Every committed value of `topic` from the beginning to its current
    end (read_committed), one at a time."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)
    try:
        tps = [TopicPartition(topic, p) for p in _partitions(bootstrap, topic)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + timeout_s
        while not all(consumer.position(tp) >= ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end in {timeout_s:.0f}s")
            for batch in consumer.poll(timeout_ms=500, max_records=10000).values():
                for record in batch:
                    if record.value is not None:
                        yield record.value
    finally:
        consumer.close()


@dataclass
class Stored:
    """What S3 holds under a prefix, listed and read with boto3."""

    objects: int = 0
    bytes: int = 0
    list_s: float = 0.0  # wall clock of the paginated listing
    ids: list[str] = field(default_factory=list)


def s3_client(endpoint: str | None) -> Any:
    return boto3.client("s3", endpoint_url=endpoint)


def list_keys(client: Any, bucket: str, prefix: str) -> tuple[list[tuple[str, int]], float]:
    """(key, size) of every object under `prefix`, and the listing's wall clock."""
    started = time.monotonic()
    keys = [(o["Key"], o["Size"])
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                        Prefix=prefix)
            for o in page.get("Contents", [])]
    return keys, time.monotonic() - started


def stored(endpoint: str | None, bucket: str, prefix: str, read_ids: bool = True) -> Stored:
    """Objects, bytes and listing time under `prefix`; with `read_ids`, the
    `id` of every JSONL line of every object."""
    client = s3_client(endpoint)
    keys, list_s = list_keys(client, bucket, prefix)
    out = Stored(objects=len(keys), bytes=sum(size for _, size in keys), list_s=list_s)
    if read_ids:
        for key, _ in keys:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            out.ids.extend(json.loads(line)["id"] for line in body.splitlines() if line)
    return out


def topic_bytes(data_dirs: list[Path], topic: str) -> int:
    """Bytes of the log segments (`*.log`: the records; the index files are
    preallocated) of every partition replica of `topic` in the brokers' data dirs."""
    total = 0
    for data in data_dirs:
        for part in data.glob(f"{topic}-*"):
            if part.is_dir() and part.name.rsplit("-", 1)[1].isdigit():
                total += sum(_size(f) for f in part.glob("*.log"))
    return total


def _size(path: Path) -> int:
    """A file's size; 0 for what vanished meanwhile (the cleaner deletes segments)."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except FileNotFoundError:
        return 0
