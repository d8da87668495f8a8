"""Where a dead-lettered `regenerate-turns` conversation goes on when it is
redriven `--from-failed-turn` (pure).

The conversation stopped at one step: a failed request (`Failure.step`), or
the first step the parent's QA policy dead-lettered (`sink/routing.py`
decides which). Every step before it was the model's own and passed: those
are carried into the redriven prompt (`PromptRecord.resume`), so the child
run generates the failed step and what follows, and no finished turn twice.
"""

from __future__ import annotations

import msgspec

from schemas import CompletionRecord, Conversation, Failure, PromptRecord, RunSpec, Step
from schemas.prompt import Resume
from sink.routing import first_listed, reasons, step_facts


def failed_step(record: CompletionRecord, spec: RunSpec) -> int:
    """Index of the step the conversation was dead-lettered at (0: from the start)."""
    if isinstance(record, Failure):
        return record.step or 0
    if isinstance(record, Conversation):
        for index, step in enumerate(record.steps):
            if first_listed(reasons(step_facts(step), spec), spec) is not None:
                return index
        return max(len(record.steps) - 1, 0)
    return 0


def next_turn(carried: tuple[Step, ...]) -> int:
    """The user turn after the carried steps: the same turn after answered tool
    calls, the next one after an answer."""
    last = carried[-1]
    return last.turn if last.tool_results else last.turn + 1


def resumed_prompt(record: CompletionRecord, spec: RunSpec) -> PromptRecord:
    """The dead letter's prompt, resuming at its failed step when it has
    steps before it; as published otherwise."""
    steps = record.steps if isinstance(record, (Failure, Conversation)) else ()
    kept = steps[:failed_step(record, spec)]
    if not kept:
        return record.prompt
    carried = tuple(msgspec.structs.replace(s, carried=True) for s in kept)
    return msgspec.structs.replace(record.prompt,
                                   resume=Resume(steps=carried, next_turn=next_turn(carried)))
