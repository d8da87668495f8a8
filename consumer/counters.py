"""Cumulative per-instance counters, committed inside each transaction
(`schemas.progress.ConsumerProgress`): the exact progress `tokenmill status`
and `--until-done` read."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import msgspec

from schemas import Completion, Conversation, Failure, Step
from schemas.completion import CompletionRecord, SpecStats, Usage
from schemas.progress import ConsumerProgress
from schemas.turn import TurnRecord


def _bump(counts: dict[str, int], key: str) -> dict[str, int]:
    out = dict(counts)
    out[key] = out.get(key, 0) + 1
    return out


def _add_usage(p: dict[str, Any], usage: Usage, spec: SpecStats, latency_s: float) -> None:
    p["prompt_tokens"] += usage.prompt_tokens
    p["completion_tokens"] += usage.completion_tokens
    p["reasoning_tokens"] += usage.reasoning_tokens
    p["cached_tokens"] += usage.cached_tokens
    p["latency_s_total"] += latency_s
    if spec.accept_length is not None and usage.completion_tokens:
        p["spec_accept_weighted"] += spec.accept_length * usage.completion_tokens
        p["spec_tokens"] += usage.completion_tokens


def _add_step(p: dict[str, Any], step: Step) -> None:
    """A generated step of a regenerate-turns conversation: a turn, its tokens."""
    p["turns"] += 1
    _add_usage(p, step.usage, step.spec, step.latency_s)


def generated_here(steps: tuple[Step, ...]) -> int:
    """Steps this run generated: a redrive `--from-failed-turn` carries the
    parent's (its conversation has a turn record out after its first own step)."""
    return sum(1 for s in steps if not s.carried)


def add_records(progress: ConsumerProgress, records: Iterable[CompletionRecord | TurnRecord],
                retries: int = 0, now: float | None = None) -> ConsumerProgress:
    """New counters after committing `records` (pure: returns a new value)."""
    p = msgspec.structs.asdict(progress)
    for record in records:
        if isinstance(record, TurnRecord):
            _add_step(p, record.steps[-1])
            p["turns_pending"] += 1 if generated_here(record.steps) == 1 else 0
            continue
        if isinstance(record, Conversation):
            _add_step(p, record.steps[-1])
            p["turns_pending"] -= 1 if generated_here(record.steps) > 1 else 0
            p["completions"] += 1
            p["by_category"] = _bump(p["by_category"], record.prompt.category)
            p["finish_reasons"] = _bump(p["finish_reasons"], record.steps[-1].finish_reason)
            continue
        if isinstance(record, Failure) and record.step and \
                record.step > len(record.steps) - generated_here(record.steps):
            p["turns_pending"] -= 1  # a conversation that had a turn record out
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
        _add_usage(p, record.usage, record.spec, record.latency_s)
    p["retries"] += retries
    p["updated_at"] = time.time() if now is None else now
    return ConsumerProgress(**p)
