"""Cumulative per-instance counters, committed inside each transaction
(`schemas.progress.ConsumerProgress`): the exact progress `tokenmill status`
and `--until-done` read."""

from __future__ import annotations

import time
from collections.abc import Iterable

import msgspec

from schemas import Completion, Failure
from schemas.completion import CompletionRecord
from schemas.progress import ConsumerProgress


def _bump(counts: dict[str, int], key: str) -> dict[str, int]:
    out = dict(counts)
    out[key] = out.get(key, 0) + 1
    return out


def add_records(progress: ConsumerProgress, records: Iterable[CompletionRecord],
                retries: int = 0, now: float | None = None) -> ConsumerProgress:
    """New counters after committing `records` (pure: returns a new value)."""
    p = msgspec.structs.asdict(progress)
    for record in records:
        if isinstance(record, Failure) and record.failure == "invalid":
            p["invalid"] += 1  # not a published prompt: not generated
            continue
        p["by_category"] = _bump(p["by_category"], record.prompt.category)
        if isinstance(record, Failure):
            p["failures"] += 1
            p["failures_by_kind"] = _bump(p["failures_by_kind"], record.failure)
            p["latency_s_total"] += record.latency_s
            continue
        assert isinstance(record, Completion)
        p["completions"] += 1
        p["finish_reasons"] = _bump(p["finish_reasons"], record.finish_reason)
        usage = record.usage
        p["prompt_tokens"] += usage.prompt_tokens
        p["completion_tokens"] += usage.completion_tokens
        p["reasoning_tokens"] += usage.reasoning_tokens
        p["cached_tokens"] += usage.cached_tokens
        p["latency_s_total"] += record.latency_s
        if record.spec.accept_length is not None and usage.completion_tokens:
            p["spec_accept_weighted"] += record.spec.accept_length * usage.completion_tokens
            p["spec_tokens"] += usage.completion_tokens
    p["retries"] += retries
    p["updated_at"] = time.time() if now is None else now
    return ConsumerProgress(**p)
