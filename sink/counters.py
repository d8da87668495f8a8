"""The sink's cumulative counters per instance (`schemas.SinkProgress`).

Written inside every flush transaction, so the committed value always equals
the committed work; a restarted instance continues from its own last
committed value. `plus` is pure: the service applies a flush's counts only
once its transaction has committed.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from schemas import SinkProgress


def plus(progress: SinkProgress, *, s3_records: int = 0, s3_objects: int = 0, s3_bytes: int = 0,
         dlq_by_reason: dict[str, int] | None = None, last_object: str = "",
         now: float = 0.0) -> SinkProgress:
    by_reason = dict(progress.dlq_by_reason)
    for reason, count in (dlq_by_reason or {}).items():
        by_reason[reason] = by_reason.get(reason, 0) + count
    return msgspec.structs.replace(
        progress,
        s3_records=progress.s3_records + s3_records,
        s3_objects=progress.s3_objects + s3_objects,
        s3_bytes=progress.s3_bytes + s3_bytes,
        dlq_records=progress.dlq_records + sum((dlq_by_reason or {}).values()),
        dlq_by_reason=dict(sorted(by_reason.items())),
        last_object=last_object or progress.last_object,
        updated_at=now or progress.updated_at,
    )


def merge_reasons(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in counts:
        for reason, count in part.items():
            out[reason] = out.get(reason, 0) + count
    return out


def start(run: str, instance: str, last_committed: bytes | None) -> SinkProgress:
    """This instance's counters as last committed, or zeros."""
    if last_committed is None:
        return SinkProgress(run=run, instance=instance)
    previous = msgspec.json.decode(last_committed, type=SinkProgress)
    if previous.run != run or previous.instance != instance:
        raise ValueError(f"progress record for {previous.run}/{previous.instance} under the key "
                         f"of {run}/{instance}")
    # A new incarnation: running again, its own S3 error count.
    return msgspec.structs.replace(previous, stopped_at=0.0, upload_errors=0, uploading_since=0.0)
