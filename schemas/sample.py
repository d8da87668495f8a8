"""One line of an S3 object: a self-contained training sample."""

from __future__ import annotations

import msgspec

from schemas.completion import ConversationOutcome, SpecStats, Step, Usage
from schemas.messages import Message, Tool, ToolCall


class GeneratedTurn(msgspec.Struct, frozen=True, omit_defaults=True):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None


class TrainingSample(msgspec.Struct, frozen=True):
    id: str
    run: str
    settings_hash: str
    messages: tuple[Message, ...]
    completion: GeneratedTurn
    finish_reason: str
    source: str
    category: str
    usage: Usage = Usage()
    spec: SpecStats = SpecStats()
    tools: tuple[Tool, ...] | None = None
    model: str = ""
    v: int = 1


class ConversationSample(msgspec.Struct, frozen=True):
    """One line of a `regenerate-turns` run: the whole conversation as the
    model saw and wrote it (`messages`: system, user turns, its own answers,
    tool results), and each generated step with its reasoning, usage, finish
    reason and spec stats."""

    id: str
    run: str
    settings_hash: str
    messages: tuple[Message, ...]
    steps: tuple[Step, ...]
    outcome: ConversationOutcome
    source: str
    category: str
    tools: tuple[Tool, ...] | None = None
    model: str = ""
    kind: str = "conversation"
    v: int = 1
