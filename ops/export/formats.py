"""One training sample (an S3 line, `schemas.TrainingSample`) in each export
format. Pure functions; `FORMATS` lists them.

- `openai`: the chat as stored, OpenAI style: the prompt's `messages`, then
  the generated assistant message with `reasoning_content`, `content` and
  `tool_calls`; `tools` as the request carried them.
- `sharegpt`: `conversations` of `{"from", "value"}` (system / human / gpt /
  observation, the FastChat and LLaMA-Factory roles); assistant turns are
  rendered as the model wrote them (below), tools as a JSON string.
- `specforge`: what SpecForge's training scripts read (`scripts/prepare_data.py`
  schema, loaded by `load_dataset("json")` or `safe_conversations_generator`
  in sgl-project/SpecForge): `{"id", "conversations": [{"role", "content"}],
  "tools": "<JSON string>"}`. Every message has exactly `role` and `content`
  strings (an Arrow-stable schema); the generated turn's content carries the
  reasoning inside `<think>...</think>` exactly as the Qwen3 chat template
  renders the last assistant turn, and tool calls as its `<tool_call>` blocks,
  so applying the template to the conversation gives back the same text.
- `parquet`: one row per sample, typed columns (`PARQUET_SCHEMA`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from schemas import TrainingSample
from schemas.messages import Message, Tool, ToolCall

_decoder = msgspec.json.Decoder(TrainingSample)
_encoder = msgspec.json.Encoder()


def decode(line: bytes) -> TrainingSample:
    return _decoder.decode(line)


# -- the Qwen3 chat template's assistant text ------------------------------------


def tool_call_text(call: ToolCall) -> str:
    """One call as Qwen3's template writes it (arguments as the JSON text they are)."""
    return ('<tool_call>\n{"name": "' + call.function.name + '", "arguments": '
            + call.function.arguments + "}\n</tool_call>")


def assistant_text(content: str | None, tool_calls: tuple[ToolCall, ...] | None,
                   reasoning: str | None = None, generated: bool = False) -> str:
    """An assistant turn's text as the Qwen3 template renders it: the
    generated (last) turn opens with `<think>\\n{reasoning}\\n</think>\\n\\n`
    (empty when the model did not think), earlier turns are content only;
    tool calls follow as `<tool_call>` blocks, each on a new line."""
    text = content or ""
    if generated:
        text = "<think>\n" + (reasoning or "").strip("\n") + "\n</think>\n\n" + text.lstrip("\n")
    for n, call in enumerate(tool_calls or ()):
        if n or content:
            text += "\n"
        text += tool_call_text(call)
    return text


def tools_json(tools: tuple[Tool, ...] | None) -> str:
    return _encoder.encode(list(tools or ())).decode()


# -- openai ---------------------------------------------------------------------------


class AssistantMessage(msgspec.Struct, omit_defaults=True):
    """The model's own turn in the openai format (reasoning kept apart from
    the visible content); conversation rows use it too."""

    role: str
    content: str | None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None


class _OpenAI(msgspec.Struct, omit_defaults=True):
    id: str
    run: str
    settings_hash: str
    messages: tuple[Message | AssistantMessage, ...]
    tools: tuple[Tool, ...] | None = None


def openai_line(sample: TrainingSample) -> bytes:
    turn = sample.completion
    generated = AssistantMessage("assistant", turn.content, turn.reasoning_content, turn.tool_calls)
    return _encoder.encode(_OpenAI(sample.id, sample.run, sample.settings_hash,
                                   (*sample.messages, generated), sample.tools)) + b"\n"


# -- sharegpt and specforge -------------------------------------------------------------

SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}


def _rendered(sample: TrainingSample) -> list[tuple[str, str]]:
    """(role, text) of every turn, assistant turns rendered as Qwen3 does."""
    turns: list[tuple[str, str]] = [
        (m.role, assistant_text(m.content, m.tool_calls) if m.role == "assistant"
         else m.content or "") for m in sample.messages]
    turn = sample.completion
    turns.append(("assistant", assistant_text(turn.content, turn.tool_calls,
                                              turn.reasoning_content, generated=True)))
    return turns


class ShareGPTTurn(msgspec.Struct):
    from_: str = msgspec.field(name="from")
    value: str = ""


class ShareGPT(msgspec.Struct):
    id: str
    conversations: list[ShareGPTTurn]
    tools: str


def sharegpt_line(sample: TrainingSample) -> bytes:
    turns = [ShareGPTTurn(SHAREGPT_ROLES[role], text) for role, text in _rendered(sample)]
    return _encoder.encode(ShareGPT(sample.id, turns, tools_json(sample.tools))) + b"\n"


class _Turn(msgspec.Struct):
    role: str
    content: str


class _SpecForge(msgspec.Struct):
    id: str
    conversations: list[_Turn]
    tools: str


def specforge_line(sample: TrainingSample) -> bytes:
    turns = [_Turn(role, text) for role, text in _rendered(sample)]
    return _encoder.encode(_SpecForge(sample.id, turns, tools_json(sample.tools))) + b"\n"


# -- parquet -----------------------------------------------------------------------------


def parquet_call_type() -> Any:
    """A tool call as a Parquet struct (`schemas.messages.ToolCall`)."""
    import pyarrow as pa

    return pa.struct([("id", pa.string()), ("type", pa.string()),
                      ("function", pa.struct([("name", pa.string()),
                                              ("arguments", pa.string())]))])


def parquet_schema() -> Any:
    """pyarrow is an optional dependency (the `parquet` extra): imported here."""
    import pyarrow as pa

    call = parquet_call_type()
    message = pa.struct([("role", pa.string()), ("content", pa.string()),
                         ("tool_calls", pa.list_(call)), ("tool_call_id", pa.string()),
                         ("name", pa.string())])
    return pa.schema([
        ("id", pa.string()), ("run", pa.string()), ("settings_hash", pa.string()),
        ("model", pa.string()), ("source", pa.string()), ("category", pa.string()),
        ("messages", pa.list_(message)), ("tools", pa.string()),
        ("reasoning_content", pa.string()), ("content", pa.string()),
        ("tool_calls", pa.list_(call)), ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
        ("reasoning_tokens", pa.int64()), ("cached_tokens", pa.int64()),
        ("accept_length", pa.float64()), ("verify_ct", pa.int64()),
    ])


PARQUET_DICTIONARY = ("run", "settings_hash", "model", "source", "category", "finish_reason")


class ParquetRow(msgspec.Struct, omit_defaults=True):
    """A row as JSON, for pyarrow's JSON reader to build the row group in C++
    against `parquet_schema()` (fields match by name; absent ones are null)."""

    id: str
    run: str
    settings_hash: str
    model: str
    source: str
    category: str
    messages: tuple[Message, ...]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int
    tools: str | None = None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    accept_length: float | None = None
    verify_ct: int | None = None


def parquet_row(sample: TrainingSample) -> bytes:
    """The sample's row as one JSON line."""
    turn = sample.completion
    usage = sample.usage
    return _encoder.encode(ParquetRow(
        sample.id, sample.run, sample.settings_hash, sample.model, sample.source,
        sample.category, sample.messages, sample.finish_reason, usage.prompt_tokens,
        usage.completion_tokens, usage.reasoning_tokens, usage.cached_tokens,
        tools_json(sample.tools) if sample.tools else None, turn.reasoning_content,
        turn.content, turn.tool_calls, sample.spec.accept_length, sample.spec.verify_ct)) + b"\n"


LINE_FORMATS: dict[str, Callable[[TrainingSample], bytes]] = {
    "openai": openai_line, "sharegpt": sharegpt_line, "specforge": specforge_line}
FORMATS = (*LINE_FORMATS, "parquet")
