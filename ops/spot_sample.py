"""Reading committed records for `tokenmill spot-check`.

`pick` scans for a few records that pass the filters (for showing one by
one); `read_sample` reads up to N records spread evenly over the partitions
and over each partition's offsets (for `--summary`): `plan_sample` decides
which offsets, purely. Both read `read_committed`, so only what the workers
committed (and the sink will route) is seen.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

import msgspec
from confluent_kafka import Consumer, KafkaError, TopicPartition

from schemas import CompletionRecord, decode_completion
from tokenmill.kafka import clients, topics
from tokenmill.kafka.committed import (
    READER_CONFIG,
    last_stable_offsets,
    offset_of,
    partition_of,
    start_offsets,
    value_of,
)
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.ops.spot_sample")

IDLE_S = 1.0  # no record for this long: what is left of a span is markers or aborted
FIRST_DATA_S = 10.0  # the first fetch after an assign may take a while
SAMPLE_TIMEOUT_S = 120.0


class Picked(msgspec.Struct, frozen=True):
    """A committed record and where it sits in the completions topic."""

    record: CompletionRecord
    partition: int
    offset: int


class Span(msgspec.Struct, frozen=True, order=True):
    """Offsets [start, end) of one partition to read."""

    partition: int
    start: int
    end: int


def quotas(sizes: Mapping[int, int], n: int) -> dict[int, int]:
    """Split n over the partitions as evenly as their sizes allow: what a
    short partition cannot give goes to the others."""
    quota = {p: 0 for p in sizes}
    remaining = n
    open_ = sorted(p for p, size in sizes.items() if size > 0)
    while remaining > 0 and open_:
        share, extra = divmod(remaining, len(open_))
        # The extra one each goes to the partitions that have least so far.
        for index, p in enumerate(sorted(open_, key=lambda p: (quota[p], p))):
            give = min(share + (1 if index < extra else 0), sizes[p] - quota[p])
            quota[p] += give
            remaining -= give
        open_ = [p for p in open_ if quota[p] < sizes[p]]
    return quota


def plan_sample(ranges: Mapping[int, tuple[int, int]], n: int, chunks: int = 4) -> list[Span]:
    """Up to n offsets in all: an even share of each partition (see `quotas`),
    read as up to `chunks` runs spread evenly over the partition's range, so
    early and late results are both seen. Spans never overlap."""
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    sizes = {p: max(0, high - low) for p, (low, high) in ranges.items()}
    spans: list[Span] = []
    for p, quota in sorted(quotas(sizes, n).items()):
        if quota == 0:
            continue
        low, size = ranges[p][0], sizes[p]
        k = min(chunks, quota)
        gap = size - quota  # offsets left out, spread between the runs
        taken = 0
        for i in range(k):
            length = quota // k + (1 if i < quota % k else 0)
            start = low + taken + (i * gap) // max(k - 1, 1)  # the last run ends the range
            spans.append(Span(p, start, start + length))
            taken += length
    return spans


def _read_round(consumer: Consumer, topic: str, spans: list[Span],
                deadline: float) -> list[Picked]:
    """Read spans of distinct partitions together, each up to its end."""
    wanted = {s.partition: s for s in spans}
    consumer.assign([TopicPartition(topic, s.partition, s.start) for s in spans])
    found: list[Picked] = []
    last_data = time.monotonic()
    idle = FIRST_DATA_S
    try:
        while wanted and time.monotonic() - last_data < idle and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.2):
                last_data = time.monotonic()
                idle = IDLE_S
                partition = message.partition()
                if partition is None or partition not in wanted:
                    continue
                span = wanted[partition]
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        del wanted[partition]
                    continue
                offset = offset_of(message)
                if offset >= span.end:
                    del wanted[partition]
                    continue
                found.append(Picked(decode_completion(value_of(message)), partition, offset))
                if offset >= span.end - 1:
                    del wanted[partition]
    finally:
        consumer.unassign()
    return found


def read_sample(settings: Settings, run_id: str, n: int, chunks: int = 4) -> list[Picked]:
    """Up to n committed records, spread evenly (see `plan_sample`)."""
    topic = topics.completions_topic(run_id)
    admin = clients.admin(settings)
    metadata = admin.list_topics(topic, timeout=settings.connect_timeout_s)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        return []
    partitions = sorted(described.partitions)
    starts = start_offsets(admin, topic, partitions, settings.connect_timeout_s)
    ends = last_stable_offsets(admin, topic, partitions, settings.connect_timeout_s)
    spans = plan_sample({p: (starts[p], ends[p]) for p in partitions}, n, chunks)
    rounds: dict[int, list[Span]] = {}
    seen: dict[int, int] = {}
    for span in spans:  # the i-th span of every partition is read in round i
        index = seen[span.partition] = seen.get(span.partition, -1) + 1
        rounds.setdefault(index, []).append(span)
    consumer = clients.consumer(settings, f"tokenmill.{run_id}.spot-check",
                                      READER_CONFIG)
    deadline = time.monotonic() + SAMPLE_TIMEOUT_S
    found: list[Picked] = []
    try:
        for index in sorted(rounds):
            found += _read_round(consumer, topic, rounds[index], deadline)
    finally:
        consumer.close()
    log.debug("sample read", records=len(found), spans=len(spans))
    return found[:n]


def pick(settings: Settings, run_id: str, n: int, keep: Callable[[CompletionRecord], bool],
         seed: int, scan_limit: int = 20_000) -> list[Picked]:
    """Up to n records that `keep` accepts, from randomly ordered partitions,
    scanning at most `scan_limit` records."""
    topic = topics.completions_topic(run_id)
    consumer = clients.consumer(settings, f"tokenmill.{run_id}.spot-check",
                                      {"enable.partition.eof": True})
    found: list[Picked] = []
    try:
        metadata = consumer.list_topics(topic, timeout=settings.connect_timeout_s)
        partitions = list(metadata.topics[topic].partitions)
        random.Random(seed).shuffle(partitions)
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
        open_partitions = set(partitions)
        scanned = 0
        while open_partitions and len(found) < n and scanned < scan_limit:
            for message in consumer.consume(200, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition())
                    continue
                scanned += 1
                record = decode_completion(value_of(message))
                if keep(record):
                    found.append(Picked(record, partition_of(message), offset_of(message)))
                    if len(found) >= n:
                        break
    finally:
        consumer.close()
    return found
