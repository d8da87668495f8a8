"""The published shape of `tokenmill status --json` (a stable interface for
monitoring scripts). `summarize` builds plain dicts for the renderer; the
JSON output is converted to `StatusReport` first, so a field that drifts
from this schema fails loudly here instead of silently in someone's cron
job. `ops/status.schema.json` is generated from it (tests keep the two in
step): `python -m ops.status_report > ops/status.schema.json`.

Times are seconds; ages are seconds before the report; shares are 0..1.
Fields may be added in later versions; none is removed or retyped without
a new `schema_version`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ops.health import Headroom, Health
from schemas.progress import ServerSnapshot

SCHEMA_VERSION = 1


class WorkerRow(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    state: Literal["active", "stale", "stopped", "dead"]
    completions: int
    failures: int
    tokens_per_s: float  # lifetime average
    recent_tokens_per_s: float  # last few minutes; 0 unless live
    recent_requests_per_s: float
    accept_length: float | None
    concurrency_limit: int
    in_flight: int  # 0 unless live
    last_commit_age_s: float
    last_result_age_s: float | None
    partitions: int
    breaker: str  # failure cause while its circuit breaker is open
    server: ServerSnapshot | None
    headroom: Headroom | None


class SinkRow(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    state: Literal["active", "stale", "stopped", "dead"]
    last_commit_age_s: float
    last_upload_age_s: float | None
    s3_objects: int
    s3_bytes: int
    s3_records: int
    dlq_records: int
    partitions: int
    waiting_records: int
    uploading_for_s: float | None
    upload_errors: int
    last_error: str
    last_error_age_s: float | None


class GroupWorker(msgspec.Struct, frozen=True):
    slots: int
    standbys: int
    partitions: list[int]
    share: float


class GroupView(msgspec.Struct, frozen=True):
    stable: bool
    workers: dict[str, GroupWorker]
    unowned: dict[str, float]  # partition -> seconds seen unowned (under --watch)


class Conversations(msgspec.Struct, frozen=True, kw_only=True):
    """`regenerate-turns` runs: turns generated, and where conversations are.
    `finished` and `failed` are committed by the workers (`failed` are
    dead-lettered by the sink with the failing step; a finished one may be
    too, by the QA policy); `in_progress` have a next-turn record out."""

    turns: int
    finished: int
    failed: int
    in_progress: int
    not_started: int


class StatusReport(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    run: str
    settings_hash: str
    published: int
    total: int
    publishing_done: bool
    generated: int
    completions: int
    completion_tokens: int
    failures: int
    failures_by_kind: dict[str, int]
    persisted: int
    s3_records: int
    s3_objects: int
    s3_bytes: int
    last_object: str
    dlq_records: int
    dlq_by_reason: dict[str, int]
    elapsed_s: float
    requests_per_s: float
    tokens_per_s: float
    eta_s: float | None
    recent_requests_per_s: float
    recent_tokens_per_s: float
    recent_window_s: float | None
    recent_eta_s: float | None
    in_flight: int
    estimate_requests_per_s: float | None
    estimate_output_tokens: float | None
    estimate_truncated_share: float | None
    estimate_tokens_per_s: float | None
    estimate_hours: float | None
    estimate_concurrency: int | None
    estimate_source: str | None
    truncated_share: float | None
    mean_output_tokens: float | None
    reasoning_share: float | None
    accept_length: float | None
    finish_reasons: dict[str, int]
    generated_by_category: dict[str, int]
    planned_by_category: dict[str, int]
    planned_by_source: dict[str, int]
    rejected: int
    duplicates: int
    instances: list[WorkerRow]
    sinks: list[SinkRow]
    generation_done: bool
    sink_done: bool
    health: Health
    group: GroupView | None = None
    lineage: dict[str, Any] | None = None
    conversations: Conversations | None = None


def to_report(summary: dict[str, Any]) -> StatusReport:
    """Raises msgspec.ValidationError when the summary left the schema."""
    plain = msgspec.to_builtins(summary)
    return msgspec.convert(plain, StatusReport)


def schema() -> dict[str, Any]:
    return msgspec.json.schema(StatusReport)


if __name__ == "__main__":
    print(msgspec.json.format(msgspec.json.encode(schema()), indent=2).decode())
