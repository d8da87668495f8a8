"""Every supported dataset record -> OpenAI-style messages plus optional tools.

Detection is per record, by field: `messages` (OpenAI chat; with `tools` or
`functions` it is a raw request body), `conversations` (ShareGPT `from`/`value`
turns, or role/content turns under that name), `instruction` (Alpaca), or
`prompt` (a plain string). A system prompt holding `<tools>` (Hermes) or
"Available tools:" JSON is labelled by that and, in structured tool mode,
lifted into `tools` (see producer/tools.py).

Pure functions: bytes or a dict in, a `Normalized` out, or a `Reject` that says
why. The first decode is typed (msgspec), so a wrong field type is reported
with its JSON path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from producer import tools as tooltext
from producer.rejects import Reject
from schemas.messages import FunctionCall, Message, Tool, ToolCall
from schemas.run import ToolMode


class RawFunction(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] | None = None


class RawToolCall(msgspec.Struct):
    function: RawFunction
    id: str | None = None
    type: str | None = None


class RawPart(msgspec.Struct):
    type: str = "text"
    text: str | None = None


class RawMessage(msgspec.Struct):
    """One turn in either dialect: OpenAI role/content or ShareGPT from/value."""

    role: str | None = None
    content: str | list[RawPart] | None = None
    from_: str | None = msgspec.field(name="from", default=None)
    value: str | dict[str, Any] | None = None
    tool_calls: list[RawToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    function_call: RawFunction | None = None


class RawRecord(msgspec.Struct):
    """Every field any supported format uses; the rest of a record is ignored."""

    messages: list[RawMessage] | None = None
    conversations: list[RawMessage] | None = None
    tools: list[Any] | str | None = None
    functions: list[Any] | None = None
    system: str | None = None
    instruction: str | None = None
    input: str | None = None
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class Normalized:
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] | None  # structured tools for the request
    format: str
    tool_text: bool  # tool specs left as text in the system prompt


ROLES: dict[str, str] = {
    "system": "system", "developer": "system",
    "user": "user", "human": "user",
    "assistant": "assistant", "gpt": "assistant", "chatgpt": "assistant", "model": "assistant",
    "bard": "assistant", "bing": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool", "function_response": "tool",
    "ipython": "tool",
    "function_call": "function_call",  # an assistant turn that calls a tool (ShareGPT)
}

_decoder = msgspec.json.Decoder(RawRecord)


def decode(data: bytes | dict[str, Any]) -> RawRecord:
    """Typed decode of one record; JSON and type errors become rejects."""
    try:
        if isinstance(data, dict):
            return msgspec.convert(data, RawRecord)
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise Reject("wrong-type", str(exc)) from None
    except msgspec.DecodeError as exc:
        text = str(exc)
        if "UTF-8" in text:
            raise Reject("invalid-utf8", text) from None
        if b"\x00" in data:  # type: ignore[operator]
            raise Reject("nul-character", "raw NUL byte in the record") from None
        raise Reject("invalid-json", text) from None


def normalize(raw: RawRecord, tool_mode: ToolMode) -> Normalized:
    """Messages + tools for one record, or a Reject naming the problem."""
    structured = tool_mode == "structured"
    if raw.messages is not None or raw.conversations is not None:
        turns = raw.messages if raw.messages is not None else raw.conversations
        assert turns is not None
        if raw.messages is not None:
            fmt = "openai-request" if (raw.tools or raw.functions) else "openai"
        else:
            fmt = "sharegpt"
        if not turns:
            raise Reject("empty-conversation", f"`{_field(raw)}` is an empty list")
        messages = convert_turns(turns, structured)
    elif raw.instruction is not None:
        fmt = "alpaca"
        text = raw.instruction
        if raw.input and raw.input.strip():
            text = f"{text}\n\n{raw.input}"
        messages = [Message(role="user", content=text)]
    elif raw.prompt is not None:
        fmt = "prompt"
        messages = [Message(role="user", content=raw.prompt)]
    else:
        raise Reject("unrecognized-format",
                     "no `messages`, `conversations`, `instruction` or `prompt` field")
    if raw.system and raw.system.strip() and not (messages and messages[0].role == "system"):
        messages.insert(0, Message(role="system", content=raw.system))

    tools: tuple[Tool, ...] | None = None
    field_tools = raw.tools if raw.tools is not None else raw.functions
    if field_tools is not None:
        tools = tooltext.normalize_tool_field(field_tools)
        if tools is None:
            raise Reject("invalid-tools", "`tools` holds an item that is not a function spec")
    messages, text_tools, kind, tool_text = _system_tools(messages, structured)
    if kind is not None:
        fmt = kind
    if text_tools:
        tools = _merge_tools(tools or (), text_tools)
    check_messages(messages)
    return Normalized(tuple(messages), tools or None, fmt, tool_text)


def _field(raw: RawRecord) -> str:
    return "messages" if raw.messages is not None else "conversations"


def convert_turns(turns: list[RawMessage], structured: bool) -> list[Message]:
    """Map roles, contents and tool calls; tool results are linked to the
    call they answer (in order) when the dataset gives no id."""
    out: list[Message] = []
    pending: list[str] = []  # ids of calls not yet answered, oldest first
    call_count = 0
    for index, turn in enumerate(turns):
        raw_role = turn.from_ if turn.from_ is not None else turn.role
        if raw_role is None:
            raise Reject("unknown-role", f"turn {index} has no `role` or `from`")
        role = ROLES.get(raw_role.lower())
        if role is None:
            raise Reject("unknown-role", f"turn {index} has unknown role {raw_role!r}")
        content = _content(turn, index, role)
        calls: tuple[ToolCall, ...] | None = None
        if role == "function_call":
            role = "assistant"
            call = tooltext.parse_call(content or "", f"call_{call_count}")
            if call is not None:
                calls, content = (call,), None
        elif role == "assistant":
            calls = _structured_calls(turn, call_count)
            if calls is None and structured and content and "<tool_call>" in content:
                split = tooltext.split_tool_calls(content, call_count)
                if split is not None:
                    content, calls = split
        if calls:
            call_count += len(calls)
            pending.extend(call.id for call in calls)
        tool_call_id = turn.tool_call_id
        if role == "tool":
            if tool_call_id is None and pending:
                tool_call_id = pending[0]
            if tool_call_id in pending:
                pending.remove(tool_call_id)
            if structured and content:
                content = tooltext.strip_tool_response(content)
        elif role == "user" and content is None:
            raise Reject("empty-message", f"turn {index} (user) has no content")
        out.append(Message(role=role, content=content, tool_calls=calls,  # type: ignore[arg-type]
                           tool_call_id=tool_call_id, name=turn.name))
    return out


def _content(turn: RawMessage, index: int, role: str) -> str | None:
    value: Any = turn.value if turn.from_ is not None else turn.content
    if turn.from_ is None and value is None and turn.value is not None:
        value = turn.value
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        if role == "function_call":
            return tooltext.arguments_text(value)
        raise Reject("wrong-type", f"turn {index}: content is an object, expected a string")
    texts = []
    for part in value:
        if part.type != "text" or part.text is None:
            raise Reject("unsupported-content",
                         f"turn {index}: content part of type {part.type!r} (text only)")
        texts.append(part.text)
    return "\n".join(texts)


def _structured_calls(turn: RawMessage, first: int) -> tuple[ToolCall, ...] | None:
    raw_calls = list(turn.tool_calls or ())
    if turn.function_call is not None:  # the legacy single-call field
        raw_calls.append(RawToolCall(function=turn.function_call))
    if not raw_calls:
        return None
    return tuple(
        ToolCall(id=call.id or f"call_{first + n}",
                 function=FunctionCall(name=call.function.name,
                                       arguments=tooltext.arguments_text(call.function.arguments)))
        for n, call in enumerate(raw_calls)
    )


def _system_tools(messages: list[Message], structured: bool
                  ) -> tuple[list[Message], tuple[Tool, ...] | None, str | None, bool]:
    """Find tool specs written into system prompts; lift them in structured mode.

    Returns (messages, lifted tools, format label, tools left as text)."""
    kind: str | None = None
    lifted: list[Tool] = []
    tool_text = False
    out: list[Message] = []
    for message in messages:
        if message.role != "system" or not message.content:
            out.append(message)
            continue
        found = tooltext.find_tool_text(message.content)
        if found.kind is None:
            out.append(message)
            continue
        kind = kind or found.kind
        if not structured or found.tools is None:
            tool_text = True
            out.append(message)
            continue
        lifted.extend(found.tools)
        if found.remaining:
            out.append(Message(role="system", content=found.remaining, name=message.name))
    return out, (tuple(lifted) or None), kind, tool_text


def _merge_tools(first: tuple[Tool, ...], second: tuple[Tool, ...]) -> tuple[Tool, ...]:
    """Both lists, the first spec of each function name winning."""
    seen: set[str] = set()
    merged: list[Tool] = []
    for tool in (*first, *second):
        name = tool["function"]["name"]
        if name not in seen:
            seen.add(name)
            merged.append(tool)
    return tuple(merged)


def check_messages(messages: list[Message]) -> None:
    """Content problems that would poison a generation request."""
    for index, message in enumerate(messages):
        if message.content and "\x00" in message.content:
            raise Reject("nul-character", f"turn {index} ({message.role}) contains a NUL character")
