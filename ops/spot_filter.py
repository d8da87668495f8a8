"""Which committed records `tokenmill spot-check` shows (pure).

Every filter given must hold (AND). `reason` names a dead-letter reason as
the sink's routing does, so it keeps dead-lettered records only.
"""

from __future__ import annotations

import msgspec

from schemas import Completion, CompletionRecord, RunSpec
from schemas.run import DLQ_REASONS
from sink.routing import dlq_reason

CATEGORIES: tuple[str, ...] = ("plain", "multi-turn", "tools", "system-prompt")
# `invalid`: a prompts-topic record that was no prompt of the run.
REASONS: tuple[str, ...] = (*sorted(DLQ_REASONS), "invalid")


class Filters(msgspec.Struct, frozen=True):
    category: str | None = None
    finish: str | None = None
    reason: str | None = None
    source: str | None = None

    def describe(self) -> str:
        """`category=tools, finish=length`, or '' without filters."""
        return ", ".join(f"{name}={value}" for name in self.__struct_fields__
                         if (value := getattr(self, name)) is not None)


def matches(record: CompletionRecord, spec: RunSpec, filters: Filters) -> bool:
    prompt = record.prompt
    if filters.category is not None and prompt.category != filters.category:
        return False
    if filters.source is not None and prompt.source != filters.source:
        return False
    if filters.finish is not None and (not isinstance(record, Completion)
                                       or record.finish_reason != filters.finish):
        return False
    if filters.reason is not None:
        found = dlq_reason(record, spec)
        if found is None or found[0] != filters.reason:
            return False
    return True
