"""A normalized prompt, as published to `tokenmill.<run>.prompts`."""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from schemas.messages import Message, Tool
from schemas.step import Step

Category = Literal["plain", "multi-turn", "tools", "system-prompt"]


class Resume(msgspec.Struct, frozen=True):
    """Where a redriven `regenerate-turns` conversation goes on
    (`tokenmill runs redrive --from-failed-turn`): the steps the parent run
    generated before the step that failed, carried (`Step.carried`), and the
    user turn the next request answers."""

    steps: tuple[Step, ...]
    next_turn: int


class PromptRecord(msgspec.Struct, frozen=True):
    """`messages` is what the model sees, except in `regenerate-turns` runs:
    there it is the dataset conversation whose user turns (and tool results)
    the worker feeds in one by one; its assistant turns are never sent."""

    id: str
    run: str
    messages: tuple[Message, ...]
    source: str  # dataset file name the prompt came from
    format: str  # detected input format, e.g. "sharegpt"
    category: Category
    line: int = 0  # 1-based line (or array index) in the source file
    turn: int | None = None  # user-turn index for the per-user-turn policy
    tools: tuple[Tool, ...] | None = None
    # A redrive's conversation resumed at its failed step; absent otherwise
    # (left out of the encoding, so every other prompt's bytes are unchanged).
    resume: Resume | UnsetType = UNSET
    seq: int = 0  # position in the run's publish order
    v: int = 1
