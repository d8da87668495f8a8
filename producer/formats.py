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

from typing import Any, NamedTuple

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


class _RawFields(msgspec.Struct):
    messages: list[RawMessage] | None = None
    conversations: list[RawMessage] | None = None
    system: str | None = None
    instruction: str | None = None
    input: str | None = None
    prompt: str | None = None


class RawRecord(_RawFields):
    """Every field any supported format uses; the rest of a record is ignored.

    Tool specs stay raw JSON bytes: datasets repeat the same few tool sets, so
    they are parsed once per distinct text (producer/tools.py), not per record."""

    tools: msgspec.Raw = msgspec.Raw()
    functions: msgspec.Raw = msgspec.Raw()


class RawRow(_RawFields):
    """The same for a Parquet row, already Python objects."""

    tools: list[Any] | str | None = None
    functions: list[Any] | None = None


class Normalized(NamedTuple):
    """One record's conversation, with the facts the multi-turn policy and the
    category need gathered during the single conversion pass."""

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] | None  # structured tools for the request
    format: str
    tool_text: bool  # tool specs left as text in a system prompt
    users: tuple[int, ...]  # positions of the user turns
    first_tool: int  # position of the first tool call or tool result (len: none)
    first_system: int  # position of the first system message (len: none)


def from_messages(messages: tuple[Message, ...], tools: tuple[Tool, ...] | None = None,
                  tool_text: bool = False, fmt: str = "openai") -> Normalized:
    """A Normalized for messages that are already normalized (facts by a scan)."""
    n = len(messages)
    return Normalized(
        messages, tools, fmt, tool_text,
        tuple(i for i, m in enumerate(messages) if m.role == "user"),
        next((i for i, m in enumerate(messages) if m.role == "tool" or m.tool_calls), n),
        next((i for i, m in enumerate(messages) if m.role == "system"), n))


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


def decode(data: bytes | dict[str, Any]) -> RawRecord | RawRow:
    """Typed decode of one record; JSON and type errors become rejects."""
    try:
        if isinstance(data, dict):
            return msgspec.convert(data, RawRow)
        return decode_json(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise decode_error(exc, data) from None


decode_json = _decoder.decode  # the hot path calls it directly; errors via decode_error


def decode_error(exc: Exception, data: bytes | dict[str, Any]) -> Reject:
    """The reject for a failed decode: wrong types, bad UTF-8, NUL, bad JSON."""
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        return Reject("wrong-type", text)
    if "UTF-8" in text:
        return Reject("invalid-utf8", text)
    if isinstance(data, bytes) and b"\x00" in data:
        return Reject("nul-character", "raw NUL byte in the record")
    return Reject("invalid-json", text)


_new = tuple.__new__  # builds a NamedTuple without its slower keyword-aware __new__


def normalize(raw: RawRecord | RawRow, tool_mode: ToolMode) -> Normalized:
    """Messages + tools for one record, or a Reject naming the problem."""
    structured = tool_mode == "structured"
    system = raw.system if raw.system and raw.system.strip() else None
    turns = raw.messages if raw.messages is not None else raw.conversations
    if turns is not None:
        conversation, fmt = _conversation(raw, turns, system, structured)
    else:
        if raw.instruction is not None:
            fmt = "alpaca"
            text = raw.instruction
            if raw.input and raw.input.strip():
                text = f"{text}\n\n{raw.input}"
        elif raw.prompt is not None:
            fmt = "prompt"
            text = raw.prompt
        else:
            raise Reject("unrecognized-format",
                         "no `messages`, `conversations`, `instruction` or `prompt` field")
        if system is None and not _has_tools_field(raw):  # the common case, kept short
            if "\x00" in text:
                raise Reject("nul-character", "turn 0 (user) contains a NUL character")
            return _new(Normalized, ((Message("user", text),), None, fmt, False, (0,), 1, 1))
        conversation = _Conversation(structured)
        if system is not None:
            conversation.system(system)
        conversation.user(text)

    tools = _field_tools(raw) if _maybe_tools_field(raw) else None
    if conversation.kind is not None:
        fmt = conversation.kind
    lifted = getattr(conversation, "lifted", None)
    if lifted:
        tools = _merge_tools(tools or (), tuple(lifted))
    messages = conversation.messages
    n = len(messages)
    first_tool = conversation.first_tool
    first_system = conversation.first_system
    return _new(Normalized, (tuple(messages), tools or None, fmt, conversation.tool_text,
                             tuple(conversation.users), n if first_tool is None else first_tool,
                             n if first_system is None else first_system))


def _conversation(raw: RawRecord | RawRow, turns: list[RawMessage], system: str | None,
                  structured: bool) -> tuple[_Conversation, str]:
    """A `messages` or `conversations` record, and its format: its turns after
    the record's `system` field, unless the conversation brings its own."""
    if raw.messages is not None:
        fmt = "openai-request" if _has_tools_field(raw) else "openai"
    else:
        fmt = "sharegpt"
    if not turns:
        raise Reject("empty-conversation", f"`{_field(raw)}` is an empty list")
    if system is not None and _role(turns[0]) == "system":
        system = None  # the conversation brings its own
    conversation = _Conversation(structured)
    if system is not None:
        conversation.system(system)
    conversation.turns(turns)
    return conversation, fmt


def _maybe_tools_field(raw: RawRecord | RawRow) -> bool:
    """Cheap first check: is there a `tools` or `functions` field at all?"""
    if isinstance(raw, RawRecord):
        return bool(len(raw.tools) or len(raw.functions))
    return raw.tools is not None or raw.functions is not None


def _has_tools_field(raw: RawRecord | RawRow) -> bool:
    if isinstance(raw, RawRow):
        return bool(raw.tools or raw.functions)
    tools, functions = raw.tools, raw.functions
    if not len(tools) and not len(functions):
        return False
    return any(len(f) and bytes(f) not in (b"null", b"[]", b'""') for f in (tools, functions))


def _field_tools(raw: RawRecord | RawRow) -> tuple[Tool, ...] | None:
    """The structured `tools` (or legacy `functions`) field, normalized."""
    tools: tuple[Tool, ...] | None
    if isinstance(raw, RawRow):
        field = raw.tools if raw.tools is not None else raw.functions
        tools = tooltext.normalize_tool_field(field) if field is not None else ()
    else:
        if not len(raw.tools) and not len(raw.functions):
            return None
        raw_field = raw.tools if len(raw.tools) else raw.functions
        tools = tooltext.tools_from_json(bytes(raw_field)) if len(raw_field) else ()
    if tools is None:
        raise Reject("invalid-tools", "`tools` holds an item that is not a function spec")
    return tools or None


def _field(raw: RawRecord | RawRow) -> str:
    return "messages" if raw.messages is not None else "conversations"


def _role(turn: RawMessage) -> str | None:
    raw_role = turn.from_ if turn.from_ is not None else turn.role
    return ROLES.get(raw_role.lower()) if raw_role is not None else None


class _Conversation:
    """Accumulates normalized messages and the facts about them in one pass."""

    # Rarely set: class-level defaults, so creating one per record stays cheap.
    first_tool: int | None = None
    first_system: int | None = None
    kind: str | None = None  # "hermes" / "available-tools" when found
    tool_text = False
    calls = 0  # tool calls so far, for generated ids
    lifted: list[Tool]  # tool specs lifted out of system prompts (set when first found)
    pending: list[str]  # ids of calls not yet answered, oldest first (set on first call)

    def __init__(self, structured: bool) -> None:
        self.structured = structured
        self.messages: list[Message] = []
        self.users: list[int] = []

    def user(self, content: str) -> None:
        if "\x00" in content:
            raise Reject("nul-character", "the prompt contains a NUL character")
        self.users.append(len(self.messages))
        self.messages.append(Message("user", content))

    def system(self, content: str | None, name: str | None = None) -> None:
        """A system prompt; tool specs written in it are found (and lifted in
        structured mode, dropping the message if nothing else is left)."""
        if content and "\x00" in content:
            raise Reject("nul-character", "the system prompt contains a NUL character")
        if content and ("<tools>" in content or "ools:" in content or "OOLS:" in content):
            found = tooltext.find_tool_text(content)
            if found.kind is not None:
                self.kind = self.kind or found.kind
                if self.structured and found.tools is not None:
                    self.lifted = [*getattr(self, "lifted", ()), *found.tools]
                    content = found.remaining
                    if not content:
                        return
                else:
                    self.tool_text = True
        if self.first_system is None:
            self.first_system = len(self.messages)
        self.messages.append(Message("system", content, None, None, name))

    def turns(self, turns: list[RawMessage]) -> None:
        """Map roles, contents and tool calls; tool results are linked to the
        call they answer (in order) when the dataset gives no id.

        Turns after the last user turn (the answer to regenerate) are never
        part of any prompt, so only their roles are checked: their content is
        neither converted nor scanned."""
        messages = self.messages
        append = messages.append
        users = self.users
        roles = ROLES
        turns = turns[: _last_user(turns) + 1]
        for index, turn in enumerate(turns):
            raw_role = turn.from_
            if raw_role is not None:
                content: Any = turn.value
            else:
                raw_role = turn.role
                content = turn.content if turn.content is not None else turn.value
                if raw_role is None:
                    raise Reject("unknown-role", f"turn {index} has no `role` or `from`")
            role = roles.get(raw_role) or roles.get(raw_role.lower())
            if content.__class__ is not str:  # None, text parts or a dict
                content = _content(content, index, role or raw_role)
            if content and "\x00" in content:  # one character: a memchr, cheap
                raise Reject("nul-character", f"turn {index} contains a NUL character")
            if role == "user":
                if content is None:
                    raise Reject("empty-message", f"turn {index} (user) has no content")
                users.append(len(messages))
                append(Message("user", content, None, None, turn.name))
            elif role == "assistant":
                self.assistant(turn, content)
            elif role == "system":
                self.system(content, turn.name)
            elif role == "tool":
                self.tool(content, turn.tool_call_id, turn.name)
            elif role == "function_call":  # ShareGPT: an assistant turn calling a tool
                self.function_call(content, turn.name)
            else:
                raise Reject("unknown-role", f"turn {index} has unknown role {raw_role!r}")

    def assistant(self, turn: RawMessage, content: str | None) -> None:
        """An assistant turn: its tool calls come structured (`tool_calls`,
        `function_call`) or, in structured mode, as <tool_call> text."""
        calls = None
        if turn.tool_calls or turn.function_call is not None:
            calls = _structured_calls(turn, self.calls)
        elif self.structured and content and "<tool_call>" in content:
            split = tooltext.split_tool_calls(content, self.calls)
            if split is not None:
                content, calls = split
        if calls:
            self._called(calls)
        self.messages.append(Message("assistant", content, calls, None, turn.name))

    def function_call(self, content: str | None, name: str | None) -> None:
        """A ShareGPT `function_call` turn: an assistant turn calling a tool
        (kept as text when it does not parse as a call)."""
        call = tooltext.parse_call(content or "", f"call_{self.calls}")
        if call is None:
            self.messages.append(Message("assistant", content, None, None, name))
        else:
            self._called((call,))
            self.messages.append(Message("assistant", None, (call,), None, name))

    def tool(self, content: str | None, tool_call_id: str | None, name: str | None) -> None:
        pending = getattr(self, "pending", [])
        if tool_call_id is None and pending:
            tool_call_id = pending[0]
        if tool_call_id in pending:
            pending.remove(tool_call_id)
        if self.structured and content:
            content = tooltext.strip_tool_response(content)
        if self.first_tool is None:
            self.first_tool = len(self.messages)
        self.messages.append(Message("tool", content, None, tool_call_id, name))

    def _called(self, calls: tuple[ToolCall, ...]) -> None:
        if self.first_tool is None:
            self.first_tool = len(self.messages)
        self.calls += len(calls)
        self.pending = [*getattr(self, "pending", ()), *(call.id for call in calls)]


def _last_user(turns: list[RawMessage]) -> int:
    """Index of the last user turn (-1 if none, then every turn is kept so the
    policy can say what is missing); roles after it are checked here."""
    for index in range(len(turns) - 1, -1, -1):
        turn = turns[index]
        raw_role = turn.from_ if turn.from_ is not None else turn.role
        if raw_role is None:
            raise Reject("unknown-role", f"turn {index} has no `role` or `from`")
        role = ROLES.get(raw_role) or ROLES.get(raw_role.lower())
        if role == "user":
            return index
        if role is None:
            raise Reject("unknown-role", f"turn {index} has unknown role {raw_role!r}")
    return len(turns) - 1


def _content(value: Any, index: int, role: str) -> str | None:
    """Non-string content: none, a function_call's dict, or OpenAI text parts."""
    if value is None:
        return None
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
