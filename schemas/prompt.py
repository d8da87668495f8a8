"""A normalized prompt, as published to `tokenmill.<run>.prompts`."""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.messages import Message, Tool

Category = Literal["plain", "multi-turn", "tools", "system-prompt"]


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
    seq: int = 0  # position in the run's publish order
    v: int = 1
