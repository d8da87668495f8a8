"""Where a completion record goes: S3, or the DLQ with a reason.

Pure functions of the record and the run spec. Every reason that applies is
found, in a fixed priority order; the first one the run's QA policy lists
sends the record to the DLQ. Reasons the policy does not list are ignored, so
such records go to S3 anyway.

A `Failure` has no generated turn and cannot be a training sample: it always
goes to the DLQ as `failed`, whatever the policy says; a failure of kind
`invalid` (the worker found a prompts-topic record that is not a prompt of
the run) goes there as `invalid`, and one of kind `invalid_tool_call` (a
regenerate-turns step called a tool wrongly) as `invalid_tool_call`.

A `Conversation` (regenerate-turns) is checked step by step; the first step
with a reason the policy lists sends the whole conversation to the DLQ, the
detail naming the step and its user turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import Completion, CompletionRecord, Conversation, Failure, RunSpec, Step
from sink.samples import CompletionView, raw_text_present

# Highest priority first: the detail of a record that is both length-capped
# and without reasoning says "length".
PRIORITY: tuple[str, ...] = ("failed", "length", "empty", "trivial", "missing_reasoning")

MAX_DETAIL_CHARS = 500


@dataclass(frozen=True, slots=True)
class Facts:
    """What routing looks at in a completion."""

    finish_reason: str
    content: str | None
    has_reasoning: bool
    has_tool_calls: bool
    completion_tokens: int


def _blank(text: str | None) -> bool:
    return text is None or not text.strip()


def _clip(text: str) -> str:
    return text if len(text) <= MAX_DETAIL_CHARS else text[: MAX_DETAIL_CHARS - 1] + "…"


def facts_of(record: Completion) -> Facts:
    return Facts(record.finish_reason, record.content, not _blank(record.reasoning_content),
                 bool(record.tool_calls), record.usage.completion_tokens)


def step_facts(step: Step) -> Facts:
    return Facts(step.finish_reason, step.content, not _blank(step.reasoning_content),
                 bool(step.tool_calls), step.usage.completion_tokens)


def view_facts(view: CompletionView) -> Facts:
    return Facts(view.finish_reason, view.content, raw_text_present(view.reasoning_content),
                 bool(view.tool_calls), view.usage.completion_tokens)


def reasons(facts: Facts, spec: RunSpec) -> list[tuple[str, str]]:
    """Every DLQ reason that applies to a completion, in priority order."""
    found: list[tuple[str, str]] = []
    if facts.finish_reason == "length":
        detail = (f"finish_reason=length after {facts.completion_tokens} completion "
                  f"tokens (max_tokens={spec.generation.max_tokens})")
        found.append(("length", detail))
    if _blank(facts.content) and not facts.has_reasoning and not facts.has_tool_calls:
        found.append(("empty", "no content, no reasoning_content, no tool_calls"))
    stripped = (facts.content or "").strip()
    limit = spec.qa.trivial_max_chars
    if not facts.has_tool_calls and len(stripped) <= limit:
        found.append(("trivial", _clip(f"answer {stripped!r} is at most {limit} characters")))
    if spec.generation.enable_thinking and not facts.has_reasoning:
        found.append(("missing_reasoning", "enable_thinking is on but no reasoning_content"))
    return found


def completion_reasons(record: Completion, spec: RunSpec) -> list[tuple[str, str]]:
    return reasons(facts_of(record), spec)


def failure_detail(record: Failure) -> str:
    status = f" (HTTP {record.status})" if record.status is not None else ""
    return _clip(f"{record.failure}{status} after {record.attempts} attempt(s): {record.error}")


def dlq_reason(record: CompletionRecord | CompletionView, spec: RunSpec) -> tuple[str, str] | None:
    """(reason, detail) if the record goes to the DLQ under the run's policy,
    else None (it goes to S3)."""
    if isinstance(record, Failure):
        where = f"step {record.step}: " if record.step is not None else ""
        if record.failure in ("invalid", "invalid_tool_call"):
            return record.failure, _clip(where + record.error)
        return "failed", _clip(where + failure_detail(record))
    if isinstance(record, Conversation):
        return conversation_reason(record, spec)
    facts = view_facts(record) if isinstance(record, CompletionView) else facts_of(record)
    return first_listed(reasons(facts, spec), spec)


def first_listed(found: list[tuple[str, str]], spec: RunSpec) -> tuple[str, str] | None:
    for reason, detail in found:
        if reason in spec.qa.dlq_reasons:
            return reason, detail
    return None


def conversation_reason(record: Conversation, spec: RunSpec) -> tuple[str, str] | None:
    """The first step that would be dead-lettered on its own decides."""
    for index, step in enumerate(record.steps):
        found = first_listed(reasons(step_facts(step), spec), spec)
        if found is not None:
            return found[0], _clip(f"step {index} (user turn {step.turn}): {found[1]}")
    return None
