"""Pass 2: publish the spool in the deterministic order, exactly once.

One transactional producer per run (`transactional.id` = tokenmill.<run>.producer).
Each transaction holds a chunk of prompts and a `ProducerCheckpoint` saying
that seq [0, next_seq) is committed; the final one says done. Both land
together or not at all, so the checkpoint always equals what is committed.

Resuming: `init_transactions` fences any earlier incarnation and aborts its
open transaction. The committed prefix is then read twice, independently:
from the checkpoint, and from the last committed record of every partition of
the prompts topic (only this producer writes there, so no one else's open
transaction can hide records). They must agree, and each partition's last
record must carry the id this run's publish order puts at its seq; otherwise
the order changed (say, a different tokenmill version normalizes differently)
and resuming would duplicate prompts, so the producer refuses.

The transaction protocol, and its start-up, are the shared ones
(tokenmill/kafka/transactions.py); each record goes through the open
transaction's `produce`, one C call while the local queue has room.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import KafkaException, TopicPartition

from producer.errors import ProducerError, ResumeMismatch
from producer.mixing import partition_sizes, publish_order
from producer.spool import SpoolReader, bucket_path
from schemas.progress import ProducerCheckpoint, producer_key
from tokenmill.kafka import clients, committed, topics, transactions
from tokenmill.kafka.transactions import KafkaFatal, TransactionAborted, Transactions
from tokenmill.log import get_logger
from tokenmill.progress import ensure_topic, read_producer_checkpoint
from tokenmill.settings import Settings
from tokenmill.watchdog import Watchdog

log = get_logger("tokenmill.producer")

TXN_TIMEOUT_S = 60.0

# librdkafka settings for bulk publishing: big batches, a bounded queue (a
# transaction's worth), lz4 from the shared producer config.
PRODUCER_CONFIG: dict[str, Any] = {
    "delivery.report.only.error": True,  # commit_transaction reports failures
    "linger.ms": 50,
    "batch.num.messages": 10_000,
    "batch.size": 1_000_000,
    "queue.buffering.max.kbytes": 128 * 1024,
    "queue.buffering.max.messages": 200_000,
    "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
}


@dataclass(frozen=True)
class PublishPlan:
    run: str
    topic: str
    partitions: int
    bucket_counts: list[int]
    spool_dir: Path
    # Per transaction. A commit blocks for a broker round trip or two (tens of
    # ms), so small transactions leave the producer idle; a crash re-sends at
    # most one transaction, which the broker discards with it.
    max_records: int = 20_000
    max_bytes: int = 32 * 1024 * 1024
    max_seconds: float = 1.0
    # What the whole run is made of, repeated in every checkpoint for
    # `tokenmill status` ("are we using the whole dataset?").
    by_category: dict[str, int] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)
    rejected: int = 0
    duplicates: int = 0

    @property
    def total(self) -> int:
        return sum(self.bucket_counts)


@dataclass
class ResumePoint:
    next_seq: int
    done: bool
    checkpoint: ProducerCheckpoint | None
    tails: dict[int, tuple[str, int]] = field(default_factory=dict)  # p -> (id, seq)


class _Tail(msgspec.Struct):
    id: str
    seq: int


_tail_decoder = msgspec.json.Decoder(_Tail)


def transactional_id(run: str) -> str:
    return topics.transactional_id(run, "producer")


class Publisher:
    """Owns the transactional producer of one run."""

    def __init__(self, settings: Settings, run: str) -> None:
        self._settings = settings
        self._run = run
        self._transactions: Transactions | None = None
        # Bounds every transaction call; there is no loop to beat.
        self._watchdog = Watchdog(f"producer of run {run}", stall_s=math.inf)

    def fence(self) -> None:
        """Become the only producer of this run; aborts a dead predecessor's
        open transaction so committed reads are not held back by it."""
        clients.check_broker(self._settings)
        ensure_topic(self._settings, self._run)
        self._watchdog.start()
        try:
            self._transactions = transactions.start(
                self._settings, transactional_id(self._run), config=PRODUCER_CONFIG,
                timeout_s=TXN_TIMEOUT_S, watchdog=self._watchdog)
        except KafkaFatal as exc:
            raise ProducerError(f"run {self._run}: {exc}") from None

    def checkpoint(self) -> ProducerCheckpoint | None:
        return read_producer_checkpoint(self._settings, self._run)

    def resume_point(self, plan: PublishPlan) -> ResumePoint:
        """The committed prefix, from the checkpoint and the topic's tails."""
        checkpoint = self.checkpoint()
        tails = last_records(self._settings, plan.topic, plan.partitions)
        from_topic = max((seq + 1 for _, seq in tails.values()), default=0)
        if checkpoint is not None and checkpoint.total != plan.total:
            raise ResumeMismatch(
                f"run {plan.run}: the committed checkpoint says {checkpoint.total:,} prompts in "
                f"all, these inputs give {plan.total:,}; the publish order changed (a different "
                f"tokenmill version?), so resuming would duplicate prompts. Use a new run id.")
        checkpointed = checkpoint.next_seq if checkpoint is not None else 0
        if checkpointed > from_topic:
            raise ResumeMismatch(
                f"run {plan.run}: the checkpoint says {checkpointed:,} prompts are published but "
                f"{plan.topic} ends at seq {from_topic:,} (was the topic deleted?); refusing "
                "to guess. Use a new run id.")
        if checkpointed < from_topic:
            # A read_committed view of the shared progress topic can lag (another
            # service's open transaction holds it back); this run's own topic
            # cannot, and its newer checkpoint is committed with those records.
            log.warning("checkpoint view behind the prompts topic; resuming from the topic",
                        run=plan.run, checkpoint=checkpointed, topic=from_topic)
        expected = _last_seqs(from_topic, plan.partitions)
        found = {p: seq for p, (_, seq) in tails.items()}
        if found != expected:
            raise ResumeMismatch(
                f"run {plan.run}: the last prompt of each partition of {plan.topic} does not "
                f"follow this run's publish order (found seqs {found}, expected {expected}).")
        if checkpointed == from_topic and checkpoint is not None and tuple(
                checkpoint.per_partition) != tuple(partition_sizes(from_topic, plan.partitions)):
            raise ResumeMismatch(
                f"run {plan.run}: the checkpoint's per-partition counts "
                f"{list(checkpoint.per_partition)} do not match round-robin publishing.")
        done = bool(checkpoint and checkpoint.done)
        return ResumePoint(from_topic, done, checkpoint, dict(tails))

    def publish(self, plan: PublishPlan, resume: ResumePoint,
                progress: Callable[[int], None] | None = None) -> int:
        """Publish seq >= resume.next_seq; returns how many were published."""
        assert self._transactions is not None, "fence() first"
        if resume.next_seq >= plan.total:
            return 0
        readers = _open_readers(plan)
        try:
            order = publish_order(plan.bucket_counts, plan.partitions)
            _skip(order, readers, resume)
            return self._publish_from(plan, resume.next_seq, order, readers, progress)
        except KafkaFatal as exc:
            raise ProducerError(f"run {plan.run}: {exc}") from None
        except (TransactionAborted, KafkaException) as exc:
            raise ProducerError(_failure(plan.run, exc)) from None
        finally:
            for reader in readers.values():
                reader.close()

    def _publish_from(self, plan: PublishPlan, seq: int, order: Iterator[tuple[int, int]],
                      readers: dict[int, SpoolReader],
                      progress: Callable[[int], None] | None) -> int:
        topic = plan.topic
        total = plan.total
        partitions = plan.partitions
        key = producer_key(plan.run).encode()
        lines = {bucket: reader.readline for bucket, reader in readers.items()}
        start = seq
        started = time.monotonic()
        transactions = self._transactions
        assert transactions is not None
        commits = 0
        while seq < total:
            with transactions.transaction() as txn:
                produce = txn.produce
                deadline = time.monotonic() + plan.max_seconds
                end = min(total, seq + plan.max_records)
                size = 0
                for partition, bucket in order:
                    line = lines[bucket]()
                    produce(topic, b'%b,"seq":%d,"v":1}' % (  # as records.finish_line does
                        memoryview(line)[32:-1], seq), line[:32], partition)  # type: ignore[str-format]
                    seq += 1
                    size += len(line)
                    if seq >= end or size >= plan.max_bytes:
                        break
                    if not seq & 1023 and time.monotonic() > deadline:
                        break
                checkpoint = ProducerCheckpoint(
                    run=plan.run, next_seq=seq, total=total, done=seq == total,
                    per_partition=tuple(partition_sizes(seq, partitions)), updated_at=time.time(),
                    by_category=plan.by_category, by_source=plan.by_source,
                    rejected=plan.rejected, duplicates=plan.duplicates)
                txn.produce(topics.progress_topic(plan.run), msgspec.json.encode(checkpoint),
                            key=key)
            commits += 1
            if progress is not None:
                progress(seq)
        log.info("published", run=plan.run, prompts=seq - start, transactions=commits,
                 seconds=round(time.monotonic() - started, 2))
        return seq - start

    def close(self) -> None:
        if self._transactions is not None:
            with self._watchdog.guard("flushing the producer", 30):
                self._transactions.producer.flush(10)
            self._transactions = None
        self._watchdog.stop()


def _failure(run: str, error: Any) -> str:
    """Why publishing stopped, and what to do; nothing uncommitted is visible."""
    return (f"run {run}: publishing stopped ({error}); the open transaction is not visible "
            "to anyone. Run the same command again: it resumes after the last committed "
            "transaction.")


def _open_readers(plan: PublishPlan) -> dict[int, SpoolReader]:
    return {b: SpoolReader(bucket_path(plan.spool_dir, b))
            for b, count in enumerate(plan.bucket_counts) if count}


def _skip(order: Iterator[tuple[int, int]], readers: dict[int, SpoolReader],
          resume: ResumePoint) -> None:
    """Advance past the committed prefix, checking each partition's last
    committed record is the one this order puts there."""
    wanted = {seq: (p, pid) for p, (pid, seq) in resume.tails.items()}
    for seq in range(resume.next_seq):
        _, bucket = next(order)
        if seq in wanted:
            key = readers[bucket].next()[:32]
            partition, pid = wanted[seq]
            if key.decode() != pid:
                raise ResumeMismatch(
                    f"the committed prompt at seq {seq} (partition {partition}) has id {pid}, "
                    f"but this run's publish order puts {key.decode()} there: the inputs or "
                    "their normalization changed. Use a new run id.")
        else:
            readers[bucket].skip()


def _last_seqs(next_seq: int, partitions: int) -> dict[int, int]:
    """Under round-robin, the last committed seq of each non-empty partition."""
    out: dict[int, int] = {}
    for p in range(partitions):
        if next_seq > p:
            out[p] = p + ((next_seq - 1 - p) // partitions) * partitions
    return out


def last_records(settings: Settings, topic: str, partitions: int,
                 timeout_s: float = 60.0) -> dict[int, tuple[str, int]]:
    """(id, seq) of the last committed prompt of each non-empty partition.

    Reads `read_committed` backwards in growing windows from the end: aborted
    records and transaction markers sit between committed ones, so the last
    record is not at a known offset."""
    consumer = clients.consumer(settings, f"{topic}.tail-reader")
    found: dict[int, tuple[str, int]] = {}
    try:
        ends = {p: (low, high)
                for p, (low, high) in _watermarks(settings, topic, partitions).items()
                if high > low}
        window = 64
        pending = dict(ends)
        deadline = time.monotonic() + timeout_s
        while pending:
            starts = {p: max(low, high - window) for p, (low, high) in pending.items()}
            consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
            last: dict[int, bytes] = {}
            while True:
                for message in consumer.consume(num_messages=1000, timeout=0.2):
                    if message.error():
                        raise RuntimeError(f"reading {topic}: {message.error()}")
                    last[message.partition() or 0] = message.value() or b""
                positions = consumer.position([TopicPartition(topic, p) for p in pending])
                if all(tp.offset >= pending[tp.partition][1] for tp in positions):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read the end of {topic}")
            for p in list(pending):
                if p in last:
                    tail = _tail_decoder.decode(last[p])
                    found[p] = (tail.id, tail.seq)
                    del pending[p]
                elif starts[p] <= pending[p][0]:
                    del pending[p]  # nothing committed in the whole partition
            window *= 8
            consumer.unassign()
    finally:
        consumer.close()
    return found


def _watermarks(settings: Settings, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(low, high) of every partition in two batched requests, each retried
    while a just-created topic has no leaders yet (committed._offsets)."""
    admin = clients.admin(settings)
    # Electing the leaders of a new topic's partitions took over 10 s on a
    # loaded broker host (NOT_LEADER_FOR_PARTITION throughout).
    timeout_s = max(settings.connect_timeout_s, 30.0)
    wanted = list(range(partitions))
    lows = committed.start_offsets(admin, topic, wanted, timeout_s)
    highs = committed.high_watermarks(admin, topic, wanted, timeout_s)
    return {p: (lows[p], highs[p]) for p in wanted}
