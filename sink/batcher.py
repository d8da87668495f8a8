"""Per-partition batches and when to close them: plain state, no I/O.

One `PartitionBatcher` per assigned partition (Kafka Connect's
TopicPartitionWriter): created on assign, dropped on revoke or loss. Records
go into the open batch; a batch is *sealed* when a rotation predicate fires,
and sealed batches wait, oldest first, until the service has uploaded and
committed them. Only the oldest sealed batch of a partition is ever in
flight, so at most one uploaded-but-uncommitted object exists per partition.

Rotation predicates (each names itself when it fires): `count`, `bytes`,
`age` (an injectable clock), `pinned` and `drain`.

Pinning keeps every object's record range fixed by its first write. After a
crash between an upload and its commit, the next owner replays from the
committed offset: its first batch starts at the same first offset and lands
on the same key. Had it flushed earlier (say by age), it would write fewer
records to that key; alone that is harmless (the rest follow under the next
key), but around a rebalance two writers can hold the same key: the new
owner commits [f, 120] while the old owner, whose commit then fails, lands
its [f, 100] on top, and 101-120 are committed yet in no object (Kafka
Connect's S3 sink lost data exactly so). So the first batch after every
(re)assignment or rewind is *probed*: the service HEADs its key, and if an
object exists, the batch is pinned to the object's recorded last offset: no
predicate may seal it before that offset is in, and it is sealed exactly
there. Every write of a key then holds the same records; the write that
creates a key is conditional (If-None-Match), so of two owners that both
probed an empty key, one wins and the other rewinds, probes and pins.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class OffsetOrderError(ValueError):
    """A record arrived whose offset is not above the previous one."""


@dataclass(frozen=True)
class BatchLimits:
    max_records: int = 500
    max_bytes: int = 64 * 1024 * 1024
    max_age_s: float = 600.0

    def __post_init__(self) -> None:
        if self.max_records < 1:
            raise ValueError(f"batch size must be >= 1, got {self.max_records}")
        if self.max_bytes < 1:
            raise ValueError(f"max batch bytes must be >= 1, got {self.max_bytes}")
        if self.max_age_s <= 0:
            raise ValueError(f"max batch age must be > 0 s, got {self.max_age_s}")


@dataclass(frozen=True)
class ExistingObject:
    """An object found at a batch's key, as its metadata describes it."""

    key: str
    etag: str
    size: int
    first_offset: int
    last_offset: int
    records: int


@dataclass(frozen=True)
class DeadLetterOut:
    """A DLQ record ready to produce."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    reason: str


@dataclass
class Batch:
    partition: int
    first_offset: int
    started_at: float
    last_offset: int = -1
    records: int = 0
    # The object's JSONL lines, newline included; joined once, at upload.
    lines: list[bytes] = field(default_factory=list)
    line_bytes: int = 0
    dead_letters: list[DeadLetterOut] = field(default_factory=list)
    dlq_bytes: int = 0
    # Objects an earlier owner wrote for this batch's key (see module doc).
    existing: tuple[ExistingObject, ...] = ()
    sealed_by: str | None = None

    @property
    def line_count(self) -> int:
        return len(self.lines)

    @property
    def bytes(self) -> int:
        return self.line_bytes + self.dlq_bytes

    @property
    def pinned_to(self) -> int | None:
        if not self.existing:
            return None
        return max(obj.last_offset for obj in self.existing)

    @property
    def next_offset(self) -> int:
        """The offset to commit for this batch: never counted, always last + 1."""
        return self.last_offset + 1

    def dlq_by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for letter in self.dead_letters:
            out[letter.reason] = out.get(letter.reason, 0) + 1
        return out


class Predicate(Protocol):
    def __call__(self, batch: Batch, limits: BatchLimits, now: float) -> bool: ...


def count_reached(batch: Batch, limits: BatchLimits, now: float) -> bool:
    return batch.records >= limits.max_records


def bytes_reached(batch: Batch, limits: BatchLimits, now: float) -> bool:
    return batch.bytes >= limits.max_bytes


def age_reached(batch: Batch, limits: BatchLimits, now: float) -> bool:
    return now - batch.started_at >= limits.max_age_s


# Checked after every record; `age` is checked on every tick.
ON_RECORD: tuple[tuple[str, Predicate], ...] = (("count", count_reached), ("bytes", bytes_reached))
ON_TICK: tuple[tuple[str, Predicate], ...] = (("age", age_reached),)


def pin_reached(batch: Batch) -> bool:
    pin = batch.pinned_to
    return pin is not None and batch.last_offset >= pin


class PartitionBatcher:
    """Batches of one partition; see the module doc.

    Parameters: `partition`, `limits` (`BatchLimits`), `clock` (monotonic
    seconds; injectable for tests)."""

    def __init__(self, partition: int, limits: BatchLimits,
                 clock: Callable[[], float]) -> None:
        self.partition = partition
        self.limits = limits
        self._clock = clock
        self.current: Batch | None = None
        self.sealed: deque[Batch] = deque()
        self._last_offset: int | None = None
        # The next batch's key must be probed before its first record.
        self.needs_probe = True
        self._pending_existing: tuple[ExistingObject, ...] = ()
        # After a rewind: records before the seek target's record are stale.
        self._resume_at: int | None = None

    # -- input ---------------------------------------------------------------

    def accepts(self, offset: int) -> bool:
        """False for records fetched before a rewind took effect."""
        if self._resume_at is None:
            return True
        if offset == self._resume_at:
            self._resume_at = None
            return True
        return False

    def resume_at(self, offset: int) -> None:
        """The partition is read again from `offset`: records fetched before
        that took effect are not taken."""
        self._resume_at = offset

    def set_existing(self, existing: tuple[ExistingObject, ...]) -> None:
        """The probe's answer for the batch the next record starts."""
        if self.current is not None:
            raise RuntimeError("probe answers belong to a batch not started yet")
        self._pending_existing = existing
        self.needs_probe = False

    def add(self, offset: int, *, line: bytes | None = None,
            dead_letter: DeadLetterOut | None = None) -> str | None:
        """Add one record: an S3 line (JSONL, newline included) or a DLQ
        record. Returns the name of the predicate that sealed the batch, if
        one fired."""
        if (line is None) == (dead_letter is None):
            raise ValueError("a record is either an S3 line or a dead letter")
        if self._last_offset is not None and offset <= self._last_offset:
            raise OffsetOrderError(
                f"partition {self.partition}: offset {offset} after {self._last_offset}")
        self._last_offset = offset
        batch = self.current
        if batch is None:
            batch = self.current = Batch(self.partition, offset, self._clock(),
                                         existing=self._pending_existing)
            self._pending_existing = ()
            self.needs_probe = False
        batch.last_offset = offset
        batch.records += 1
        if line is not None:
            batch.lines.append(line)
            batch.line_bytes += len(line)
        else:
            assert dead_letter is not None
            batch.dead_letters.append(dead_letter)
            batch.dlq_bytes += len(dead_letter.value)
        if batch.existing:
            if pin_reached(batch):
                return self._seal("pinned")
            return None
        for name, predicate in ON_RECORD:
            if predicate(batch, self.limits, 0.0):
                return self._seal(name)
        return None

    def tick(self) -> str | None:
        """Seal the open batch if it is old enough; returns the predicate name."""
        batch = self.current
        if batch is None or batch.existing:
            return None
        now = self._clock()
        for name, predicate in ON_TICK:
            if predicate(batch, self.limits, now):
                return self._seal(name)
        return None

    def drain(self) -> bool:
        """Seal the open batch now (nothing more will come); a pinned batch
        cannot be sealed before its pin. Returns True if sealed."""
        batch = self.current
        if batch is None or batch.existing:
            return False
        self._seal("drain")
        return True

    def _seal(self, reason: str) -> str:
        assert self.current is not None
        self.current.sealed_by = reason
        self.sealed.append(self.current)
        self.current = None
        return reason

    # -- output --------------------------------------------------------------

    def ready(self) -> Batch | None:
        """The oldest sealed batch: the only one that may be uploaded now."""
        return self.sealed[0] if self.sealed else None

    def committed(self, batch: Batch) -> None:
        """The batch is uploaded and its offsets committed."""
        if not self.sealed or self.sealed[0] is not batch:
            raise RuntimeError("only the oldest sealed batch can be committed")
        self.sealed.popleft()

    def rewind(self) -> int | None:
        """Forget every batch not committed and return the offset to seek to
        (the first offset of the oldest one), or None if nothing was pending.
        The next batch is probed again."""
        oldest = self.sealed[0] if self.sealed else self.current
        self.sealed.clear()
        self.current = None
        self._pending_existing = ()
        self.needs_probe = True
        if oldest is None:
            return None
        self._resume_at = oldest.first_offset
        self._last_offset = oldest.first_offset - 1
        return oldest.first_offset

    @property
    def pending_bytes(self) -> int:
        return sum(b.bytes for b in self.sealed) + (self.current.bytes if self.current else 0)

    @property
    def pending_records(self) -> int:
        return sum(b.records for b in self.sealed) + (self.current.records if self.current else 0)

    @property
    def idle(self) -> bool:
        return self.current is None and not self.sealed
