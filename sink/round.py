"""A flush round, and what its transaction commits.

A *round* is the oldest sealed batch of every partition that has one,
uploaded in parallel, then committed in ONE transaction: the batches' DLQ
records, this instance's counters, and each partition's next offset (after
the batch's last record, never counted). Only one round is in flight at a
time, so a partition never has a second upload before the first is
committed: at most one uploaded-but-uncommitted object per partition, and
an offset is committed only after its upload returned.

How a round ends:
- committed: each batch is forgotten by its batcher, the counters move on;
- its transaction aborted, or forgotten (`commit` False): every batch is
  rewound (the partition is read again from its oldest uncommitted batch);
- an upload lost a conditional write (another writer owns the key): that
  batch is rewound and replayed pinned to the other object, the rest commit;
- an upload failed for good (S3Failed): raised, after every upload of the
  round has returned; nothing of it is committed.

Partitions leaving (`Rounds.leave`): on revoke the round in flight finishes
and commits (a cooperative revoke runs while the group generation is still
ours); on loss it finishes (uploads cannot be recalled) and commits nothing.
Either way their batchers are then dropped, never rewound. So a
partition's upload has finished before the partition is released, and this
instance never uploads for it again unless it is assigned anew; pinning
(sink/batcher.py) and conditional writes make a replayed object identical
to whatever an earlier owner wrote.

No Kafka or S3 here: uploads come in as futures, the commit as a
collaborator (sink/committer.py), so the rules are tested without either.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec

from schemas import SinkProgress
from sink import counters
from sink.batcher import Batch, PartitionBatcher
from sink.errors import ObjectConflict
from sink.liveness import Commits, Liveness
from sink.metrics import SinkMetrics
from sink.ownership import Ownership
from sink.s3_writer import Uploaded
from tokenmill.kafka.transactions import TransactionAborted
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink")

StartUpload = Callable[[Batch], "Future[Uploaded | None]"]


@dataclass(frozen=True)
class Upload:
    """One batch of a round and its upload (None: a batch of DLQ records only)."""

    batcher: PartitionBatcher
    batch: Batch
    future: Future[Uploaded | None]


@dataclass(frozen=True)
class Written:
    """A batch whose upload returned."""

    batcher: PartitionBatcher
    batch: Batch
    uploaded: Uploaded | None


@dataclass(frozen=True)
class Settled:
    """A round once every upload returned: the written batches, the batches
    that lost a conditional write, and the first failure, if any."""

    written: list[Written]
    conflicts: list[tuple[PartitionBatcher, ObjectConflict]]
    failure: BaseException | None


@dataclass
class Round:
    """One round in flight: the oldest sealed batch of some partitions,
    uploading."""

    uploads: list[Upload]
    started_at: float = field(default_factory=time.time)

    @property
    def partitions(self) -> list[int]:
        return [s.batch.partition for s in self.uploads]

    def done(self) -> bool:
        return all(s.future.done() for s in self.uploads)

    def settle(self) -> Settled:
        """Wait for every upload, then sort them out."""
        written: list[Written] = []
        conflicts: list[tuple[PartitionBatcher, ObjectConflict]] = []
        failure: BaseException | None = None
        for upload in self.uploads:
            try:
                written.append(Written(upload.batcher, upload.batch, upload.future.result()))
            except ObjectConflict as exc:
                conflicts.append((upload.batcher, exc))
            except BaseException as exc:  # noqa: BLE001 - reported after the others
                failure = failure or exc
        return Settled(written, conflicts, failure)


@dataclass(frozen=True)
class Contents:
    """What the transaction of a round holds, besides the batches' DLQ
    records: the counts its counters grow by, and the offsets it commits."""

    batches: list[Batch]
    objects: list[Uploaded]
    dlq_by_reason: dict[str, int]
    s3_records: int
    s3_bytes: int

    @classmethod
    def of(cls, written: Sequence[Written]) -> Contents:
        batches = [w.batch for w in written]
        objects = [w.uploaded for w in written if w.uploaded is not None]
        return cls(batches=batches, objects=objects,
                   dlq_by_reason=counters.merge_reasons(b.dlq_by_reason() for b in batches),
                   s3_records=sum(b.line_count for b in batches),
                   s3_bytes=sum(o.size for o in objects))

    @property
    def next_offsets(self) -> dict[int, int]:
        """Per partition, the offset to commit: after its batch's last record."""
        return {b.partition: b.next_offset for b in self.batches}

    def progress(self, before: SinkProgress, *, now: float,
                 liveness: dict[str, Any]) -> SinkProgress:
        """The counters once committed: `before` plus this round."""
        return msgspec.structs.replace(counters.plus(
            before, s3_records=self.s3_records, s3_objects=len(self.objects),
            s3_bytes=self.s3_bytes, dlq_by_reason=self.dlq_by_reason,
            last_object=self.objects[-1].key if self.objects else "", now=now),
            last_upload_at=now, **liveness)


class Rounds:
    """The round in flight (at most one) and how rounds start and end.

    Parameters: `ownership` (the batchers; rewinds and drops), `upload`
    (starts a batch's upload; a future), `committer`, `liveness` (this
    instance's progress record), `metrics`."""

    def __init__(self, *, ownership: Ownership, upload: StartUpload, committer: Commits,
                 liveness: Liveness, metrics: SinkMetrics) -> None:
        self._ownership = ownership
        self._upload = upload
        self._committer = committer
        self._liveness = liveness
        self._metrics = metrics
        self.in_flight: Round | None = None

    def busy_since(self) -> float:
        """Wall time the round in flight started; 0: none."""
        return self.in_flight.started_at if self.in_flight is not None else 0.0

    @property
    def uploading(self) -> list[int]:
        return self.in_flight.partitions if self.in_flight is not None else []

    def advance(self, *, wait: bool = False, start: bool = True) -> None:
        """Commit the round in flight once its uploads are done (or now, with
        `wait`), then, with `start`, start the next if batches are sealed."""
        if self.in_flight is not None and (wait or self.in_flight.done()):
            self.finish(commit=True)
        if self.in_flight is None and start:
            self.start()

    def start(self) -> bool:
        """Start uploading the oldest sealed batch of every partition that has
        one (at most one per partition: the previous one is committed)."""
        if self.in_flight is not None:
            raise RuntimeError("a round is in flight: its batches are not committed yet")
        ready = [(b, batch) for b in self._ownership.batchers.values()
                 if (batch := b.ready()) is not None]
        if not ready:
            return False
        self.in_flight = Round([Upload(b, batch, self._upload(batch)) for b, batch in ready])
        return True

    def abandon(self) -> None:
        """Forget the round in flight, uncommitted and not rewound: the
        process is going down after a failure, the next owner replays it."""
        self.in_flight = None

    def leave(self, partitions: Iterable[int], *, lost: bool) -> None:
        """The partitions are revoked (`lost` False: the round in flight
        commits first) or lost (it commits nothing); then they are dropped."""
        partitions = list(partitions)
        if self.in_flight is not None:
            self.finish(commit=not lost, leaving=set(partitions))
        self._ownership.drop(partitions, "lost" if lost else "revoked")

    def finish(self, *, commit: bool, leaving: Collection[int] = ()) -> None:
        """Wait for the round's uploads, then commit them in one transaction
        (or, with `commit` False, forget them). `leaving`: partitions being
        revoked or lost, dropped right after, so never rewound."""
        current, self.in_flight = self.in_flight, None
        if current is None:
            return
        settled = current.settle()
        for batcher, conflict in settled.conflicts:
            log.warning("another writer owns this key: replaying the batch pinned to it",
                        key=conflict.key, partition=batcher.partition)
            self._metrics.conflicts.inc()
        if settled.failure is not None:
            raise settled.failure
        for batcher, _ in settled.conflicts:
            self._rewind(batcher, leaving)
        if not settled.written:
            return
        if not commit or not self._commit(settled.written):
            for written in settled.written:
                self._rewind(written.batcher, leaving)

    def _rewind(self, batcher: PartitionBatcher, leaving: Collection[int]) -> None:
        self._ownership.rewind(batcher, leaving=batcher.partition in leaving)

    def _commit(self, written: Sequence[Written]) -> bool:
        """One transaction: DLQ records, counters, offsets. False: aborted."""
        contents = Contents.of(written)
        updated = contents.progress(self._liveness.progress, now=time.time(),
                                    liveness=self._liveness.fields(uploading_since=0.0))
        started = time.perf_counter()
        try:
            self._committer.commit(contents.batches, updated)
        except TransactionAborted:
            self._metrics.aborts.inc()
            return False
        self._metrics.commit_seconds.observe(time.perf_counter() - started)
        self._liveness.committed(updated)
        self._count(written, contents)
        return True

    def _count(self, written: Sequence[Written], contents: Contents) -> None:
        """Committed: forget the batches, count them."""
        metrics = self._metrics
        for w in written:
            w.batcher.committed(w.batch)
            metrics.flushes.labels(w.batch.sealed_by or "unknown").inc()
        metrics.s3_records.inc(contents.s3_records)
        metrics.objects.inc(len(contents.objects))
        metrics.bytes.inc(contents.s3_bytes)
        for reason, count in contents.dlq_by_reason.items():
            metrics.dlq_records.labels(reason).inc(count)
        for w in written:
            batch, up = w.batch, w.uploaded
            log.info("batch committed", partition=batch.partition,
                     first_offset=batch.first_offset, last_offset=batch.last_offset,
                     trigger=batch.sealed_by, s3_records=batch.line_count,
                     dlq_records=len(batch.dead_letters), key=up.key if up else None,
                     bytes=up.size if up else 0)

