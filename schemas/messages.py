"""OpenAI-style chat messages, the normalized form every prompt takes."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


class ToolCall(msgspec.Struct, frozen=True):
    """Always encodes `type` and `id`: OpenAI-compatible servers require them."""

    function: FunctionCall
    id: str = ""
    type: str = "function"


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    role: Role
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None


# A tool spec as the OpenAI `tools` request field carries it:
# {"type": "function", "function": {"name", "description", "parameters"}}.
# Kept as a plain mapping: datasets carry arbitrary JSON Schema in it.
Tool = dict[str, Any]
