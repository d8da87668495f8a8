"""Tool specs and tool calls written as text, turned into OpenAI structures.

Function-calling datasets often carry their tools inside the system prompt:
Hermes puts a JSON list (or Python-literal dicts) between `<tools>` and
`</tools>`, others write "Available tools:" followed by JSON. Hermes
assistant turns call tools as `<tool_call>{...}</tool_call>` and tool turns
answer inside `<tool_response>...</tool_response>`.

In structured mode the producer lifts these into the request's `tools` field
and the messages' `tool_calls`, and removes exactly the lifted block from the
text: the model's chat template renders tools and calls in the model's own
format, so leaving the block in would show every tool twice. Text that does
not parse is left as it is, never dropped.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from schemas.messages import FunctionCall, Tool, ToolCall

HERMES_TOOLS = re.compile(r"<tools>(.*?)</tools>", re.DOTALL)
AVAILABLE_TOOLS = re.compile(r"Available tools:[ \t]*\n?", re.IGNORECASE)
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_RESPONSE = re.compile(r"^\s*<tool_response>\s*(.*?)\s*</tool_response>\s*$", re.DOTALL)
# Python-literal parsing is a fallback for Hermes' single-quoted dicts; keep
# it away from huge inputs.
LITERAL_MAX_CHARS = 1_000_000

_json_decoder = json.JSONDecoder()


@dataclass(frozen=True)
class ToolText:
    """Result of looking for a tool block in a system prompt."""

    kind: str | None  # "hermes", "available-tools", or None when no block
    tools: tuple[Tool, ...] | None  # parsed specs; None when absent or unparseable
    remaining: str  # the prompt with the block removed (unchanged if not parsed)


# Memos: a dataset repeats a few system prompts and tool sets thousands of
# times; results are shared, never mutated.
MEMO_SIZE = 1024


@functools.lru_cache(maxsize=MEMO_SIZE)
def find_tool_text(system: str) -> ToolText:
    """Look for a Hermes `<tools>` block, else an "Available tools:" JSON block."""
    if "<tools>" in system:
        # Hermes' preamble mentions "<tools></tools> XML tags": skip empty blocks.
        for m in HERMES_TOOLS.finditer(system):
            if not m.group(1).strip():
                continue
            tools = parse_tool_list(m.group(1))
            if tools is None:
                return ToolText("hermes", None, system)
            return ToolText("hermes", tools, _cut(system, m.start(), m.end()))
    if "vailable tools:" in system or "VAILABLE TOOLS:" in system:
        marker = AVAILABLE_TOOLS.search(system)
        if marker is not None:
            found = _json_values(system, marker.end())
            if found is None:
                return ToolText("available-tools", None, system)
            values, end = found
            tools = _as_tools(values)
            if tools is None:
                return ToolText("available-tools", None, system)
            return ToolText("available-tools", tools, _cut(system, marker.start(), end))
    return ToolText(None, None, system)


def _cut(text: str, start: int, end: int) -> str:
    """Remove text[start:end], joining the two sides with one blank line."""
    before, after = text[:start].rstrip(), text[end:].lstrip()
    if before and after:
        return f"{before}\n\n{after}"
    return before or after


def parse_tool_list(text: str) -> tuple[Tool, ...] | None:
    """A JSON list, a sequence of JSON objects, or a Python-literal list."""
    text = text.strip()
    if not text:
        return None
    try:
        return _as_tools([msgspec.json.decode(text)])
    except msgspec.DecodeError:
        pass
    found = _json_values(text, 0)
    if found is not None and found[1] >= len(text.rstrip()):
        return _as_tools(found[0])
    literal = _literal(text)
    return _as_tools([literal]) if literal is not None else None


def _json_values(text: str, start: int) -> tuple[list[Any], int] | None:
    """Consecutive JSON values from `start` (whitespace or commas between)."""
    values: list[Any] = []
    at = start
    end = start
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] not in "[{":
            break
        try:
            value, at = _json_decoder.raw_decode(text, at)
        except ValueError:
            break
        values.append(value)
        end = at
    return (values, end) if values else None


def _literal(text: str) -> Any:
    if len(text) > LITERAL_MAX_CHARS:
        return None
    try:
        value = ast.literal_eval(text)
        msgspec.json.encode(value)  # only JSON-shaped values
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError,
            msgspec.EncodeError):
        return None
    return value


def _as_tools(values: list[Any]) -> tuple[Tool, ...] | None:
    """Flatten and normalize to OpenAI tool specs; None if any item is not one."""
    items: list[Any] = []
    for value in values:
        items.extend(value if isinstance(value, list) else [value])
    tools = [normalize_tool(item) for item in items]
    if not tools or any(tool is None for tool in tools):
        return None
    return tuple(tool for tool in tools if tool is not None)


def normalize_tool(item: Any) -> Tool | None:
    """{"type": "function", "function": {...}} as is; a bare function spec
    ({"name", "description", "parameters"}) wrapped; anything else None."""
    if not isinstance(item, dict):
        return None
    function = item.get("function")
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        kind = item.get("type")
        if kind == "function":
            return item  # already the OpenAI shape
        if kind is not None:
            return None
        return {"type": "function", **item}
    if isinstance(item.get("name"), str):
        return {"type": "function", "function": item}
    return None


@functools.lru_cache(maxsize=MEMO_SIZE)
def tools_from_json(raw: bytes) -> tuple[Tool, ...] | None:
    """A `tools` field from its JSON text: a list, or a string holding JSON."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if value is None:
        return ()
    if not isinstance(value, (list, str)):
        return None
    return normalize_tool_field(value)


def normalize_tool_field(raw: list[Any] | str) -> tuple[Tool, ...] | None:
    """A structured `tools`/`functions` field (some datasets store it as a JSON
    string). Empty means no tools; unusable specs return None."""
    if isinstance(raw, str):
        if not raw.strip():
            return ()
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(raw, list):
            raw = [raw]
    if not raw:
        return ()
    return _as_tools(list(raw))


def split_tool_calls(content: str, first_id: int) -> tuple[str | None, tuple[ToolCall, ...]] | None:
    """Hermes `<tool_call>{...}</tool_call>` blocks -> structured calls and the
    remaining text; None when there are none or one does not parse."""
    if "<tool_call>" not in content:
        return None
    calls: list[ToolCall] = []
    for number, m in enumerate(TOOL_CALL.finditer(content)):
        call = parse_call(m.group(1), f"call_{first_id + number}")
        if call is None:
            return None
        calls.append(call)
    if not calls:
        return None
    remaining = TOOL_CALL.sub("", content).strip()
    return (remaining or None), tuple(calls)


def parse_call(text: str, call_id: str) -> ToolCall | None:
    """{"name": ..., "arguments": {...} | "json"} as JSON or a Python literal."""
    text = text.strip()
    value: Any
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        value = _literal(text)
    if isinstance(value, dict) and "function" in value and isinstance(value["function"], dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ToolCall(id=call_id, function=FunctionCall(name=value["name"],
                                                      arguments=arguments_text(arguments)))


def arguments_text(arguments: Any) -> str:
    """OpenAI carries arguments as JSON text; datasets often store a dict.
    Written the way `json.dumps` writes it (", " and ": "), as OpenAI does."""
    if isinstance(arguments, str):
        return arguments
    if arguments is None:
        return "{}"
    try:
        return msgspec.json.format(msgspec.json.encode(arguments), indent=0).decode()
    except (TypeError, msgspec.EncodeError):
        return json.dumps(arguments, ensure_ascii=False, default=str)


def strip_tool_response(content: str) -> str:
    """The body of a Hermes `<tool_response>` wrapper (the template adds its own)."""
    m = TOOL_RESPONSE.match(content)
    return m.group(1) if m else content
