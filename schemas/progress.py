"""Exact progress, committed in the same Kafka transaction as the work it
counts, in the compacted topic `tokenmill.<run>.progress` (one per run).

Offsets cannot be counted (transaction markers take slots) and reading a
million completions to count them is too slow, so every service keeps
cumulative counters per instance and writes them inside each transaction.
A committed counter therefore always equals the committed work: summing the
latest value of every key of a run gives exact totals.

Keys: `<run>/producer`, `<run>/consumer/<instance>`, `<run>/sink/<instance>`.
"""

from __future__ import annotations

import msgspec


class ProducerCheckpoint(msgspec.Struct, frozen=True, tag="producer", tag_field="kind"):
    run: str
    next_seq: int  # prompts [0, next_seq) of the publish order are committed
    total: int  # prompts the run publishes in all (after dedupe and rejects)
    done: bool = False
    per_partition: tuple[int, ...] = ()  # committed prompts per partition
    updated_at: float = 0.0
    # What the run is made of (whole plan, not just the committed part), so
    # `tokenmill status` can answer "are we using the whole dataset?".
    by_category: dict[str, int] = {}
    by_source: dict[str, int] = {}
    rejected: int = 0
    duplicates: int = 0
    v: int = 1


class ServerSnapshot(msgspec.Struct, frozen=True):
    """What the worker's SGLang server said about itself (/metrics and
    /get_server_info) shortly before the commit: the GPU's side of "can the
    batch grow?"."""

    running: float = 0.0  # sglang:num_running_reqs
    queued: float = 0.0  # sglang:num_queue_reqs
    token_usage: float = 0.0  # sglang:token_usage, KV cache share in use
    gen_throughput: float = 0.0  # sglang:gen_throughput, tok/s
    accept_length: float | None = None  # sglang:spec_accept_length
    max_running_requests: int | None = None  # /get_server_info
    at: float = 0.0  # epoch seconds of the reading


class ConsumerProgress(msgspec.Struct, frozen=True, tag="consumer", tag_field="kind"):
    run: str
    instance: str
    completions: int = 0
    failures: int = 0
    failures_by_kind: dict[str, int] = {}
    # Prompts-topic records that were not prompts of the run (dead-lettered
    # as `invalid`); not counted as generated: the producer never published them.
    invalid: int = 0
    finish_reasons: dict[str, int] = {}
    by_category: dict[str, int] = {}
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    # Sums for averages: accept length weighted by completion tokens.
    spec_accept_weighted: float = 0.0
    spec_tokens: int = 0
    latency_s_total: float = 0.0
    retries: int = 0
    # Snapshot at commit time: the answer to "what batch size are we running?"
    concurrency_limit: int = 0
    in_flight: int = 0
    breaker: str = ""  # the failure cause while the circuit breaker is open
    server: ServerSnapshot | None = None
    started_at: float = 0.0
    updated_at: float = 0.0
    # Liveness, for `status`: how often an idle instance still commits (a
    # record older than twice this is a dead process), when it last
    # committed results, and when it stopped cleanly (0: running or died).
    heartbeat_s: float = 0.0
    last_work_at: float = 0.0
    stopped_at: float = 0.0
    partitions: int = 0  # partitions owned at the commit
    # Rates over the last few minutes (lifetime averages never fall).
    recent_requests_per_s: float = 0.0
    recent_tokens_per_s: float = 0.0
    recent_window_s: float = 0.0
    # `regenerate-turns`: generated steps committed (each conversation's
    # last step included) and conversations still going (a turn record out).
    turns: int = 0
    turns_pending: int = 0
    v: int = 1


class SinkProgress(msgspec.Struct, frozen=True, tag="sink", tag_field="kind"):
    run: str
    instance: str
    s3_records: int = 0
    s3_objects: int = 0
    s3_bytes: int = 0
    dlq_records: int = 0
    dlq_by_reason: dict[str, int] = {}
    last_object: str = ""
    updated_at: float = 0.0
    heartbeat_s: float = 0.0
    last_upload_at: float = 0.0  # the last commit that carried S3 objects or DLQ records
    stopped_at: float = 0.0
    partitions: int = 0
    uploading_since: float = 0.0  # start of the S3 uploads in flight (0: none)
    waiting_records: int = 0  # records read and not yet committed
    upload_errors: int = 0  # failed S3 attempts (retried or not), this incarnation
    last_error: str = ""
    last_error_at: float = 0.0
    v: int = 1


Progress = ProducerCheckpoint | ConsumerProgress | SinkProgress

_decoder = msgspec.json.Decoder(Progress)


def decode_progress(data: bytes) -> Progress:
    return _decoder.decode(data)


def producer_key(run: str) -> str:
    return f"{run}/producer"


def consumer_key(run: str, instance: str) -> str:
    return f"{run}/consumer/{instance}"


def sink_key(run: str, instance: str) -> str:
    return f"{run}/sink/{instance}"
