"""What this instance tells `status` about itself: its progress record
(cumulative counters plus the health fields `status` judges it by),
committed with every round and alone as a heartbeat while idle; and a
warning while S3 calls hang (botocore retries quietly for minutes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import msgspec

from schemas import SinkProgress
from sink import counters
from sink.batcher import Batch
from sink.ownership import Ownership
from sink.s3_attempts import S3Errors
from tokenmill.kafka.transactions import TransactionAborted
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink")

SLOW_UPLOAD_S = 30.0  # S3 calls in flight this long are logged (and again as long again)


class Commits(Protocol):
    """The transaction of a round (sink/committer.py): batches and counters."""

    def commit(self, batches: Sequence[Batch], progress: SinkProgress) -> None: ...


def busy_since(*started: float) -> float:
    """The earliest of some start times, 0 (nothing in flight) left out."""
    return min((s for s in started if s), default=0.0)


class Liveness:
    """Parameters: `progress` (this instance's record as last committed),
    `committer`, `ownership` (what it owns and holds), `s3_errors` (failed
    S3 attempts), `heartbeat_s`, `clock` (monotonic), `last_commit` (the
    clock's time the first heartbeat counts from)."""

    def __init__(self, *, progress: SinkProgress, committer: Commits, ownership: Ownership,
                 s3_errors: S3Errors, heartbeat_s: float, clock: Callable[[], float],
                 last_commit: float) -> None:
        self.progress = progress
        self._committer = committer
        self._ownership = ownership
        self._errors = s3_errors
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._last_commit = last_commit
        self._next_slow_log = 0.0

    def fields(self, *, uploading_since: float) -> dict[str, Any]:
        """The fields `status` judges this instance's health by."""
        errors = self._errors
        return {
            "heartbeat_s": self._heartbeat_s,
            "partitions": len(self._ownership.batchers),
            "uploading_since": uploading_since,
            "waiting_records": self._ownership.pending_records,
            "upload_errors": errors.count,
            "last_error": errors.last or self.progress.last_error,
            "last_error_at": errors.last_at or self.progress.last_error_at,
        }

    def committed(self, progress: SinkProgress) -> None:
        """A round's transaction committed this record."""
        self.progress = progress
        self._last_commit = self._clock()

    def due(self, now: float) -> bool:
        """Nothing committed for a heartbeat interval."""
        return now - self._last_commit >= self._heartbeat_s

    def heartbeat(self, *, uploading_since: float, final: bool = False) -> None:
        """Commit the counters alone (no offsets): the instance is alive, and
        what it is doing (`final`: it stopped cleanly)."""
        self._last_commit = self._clock()
        now = time.time()
        beat = msgspec.structs.replace(counters.plus(self.progress, now=now),
                                       stopped_at=now if final else 0.0,
                                       **self.fields(uploading_since=uploading_since))
        try:
            self._committer.commit([], beat)
        except TransactionAborted:
            return
        self.progress = beat

    def record_failure(self, exc: BaseException, *, uploading_since: float) -> None:
        """S3 gave up: say so in the progress record before exiting, so
        `status` shows why this sink is gone. Best effort."""
        self._errors.note(str(exc))
        try:
            self.heartbeat(uploading_since=uploading_since)
        except Exception as error:  # noqa: BLE001 - the S3 failure is what counts
            log.debug("recording the S3 failure", error=str(error))

    def log_slow_s3(self, *, since: float, uploading: Sequence[int],
                    probing: Sequence[int]) -> None:
        """Warn while S3 calls started at `since` are still in flight."""
        now = time.time()
        if since and now - since >= SLOW_UPLOAD_S and now >= self._next_slow_log:
            self._next_slow_log = now + SLOW_UPLOAD_S
            log.warning("S3 calls still in flight", seconds=round(now - since),
                        uploading=sorted(uploading), probing=sorted(probing),
                        failed_attempts=self._errors.count,
                        last_error=self._errors.last or None)
