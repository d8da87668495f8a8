"""A completion as one self-contained training sample (one JSONL line).

`to_sample` is the definition: `schemas.TrainingSample` built from a typed
`Completion`. The sink's hot path reaches the same bytes without decoding
the bulky parts: `decode_view` reads a completion record with the prompt's
messages and tools and the reasoning text kept as raw JSON (`msgspec.Raw`),
and `write_line` encodes the sample straight into the batch's buffer, the
raw parts copied verbatim. For records written by msgspec (the consumer's
encoder) the line is byte for byte what `encode_line(to_sample(record))`
gives; a property test holds the two paths together.

What the fast path does not re-validate (prompt messages and tools, the
reasoning text's type) was validated by the producer and the consumer, which
both decode them typed; everything routing looks at is decoded typed here.
"""

from __future__ import annotations

import re

import msgspec
from msgspec import UNSET, Raw, UnsetType

from schemas import Completion, Conversation, Failure, TrainingSample
from schemas.completion import SpecStats, Usage
from schemas.messages import ToolCall
from schemas.sample import ConversationSample, GeneratedTurn
from tokenmill.conversation import final_transcript

_encoder = msgspec.json.Encoder()
NULL = b"null"


# -- the definition ----------------------------------------------------------------


def to_sample(record: Completion) -> TrainingSample:
    prompt = record.prompt
    return TrainingSample(
        id=record.id,
        run=record.run,
        settings_hash=record.settings_hash,
        messages=prompt.messages,
        completion=GeneratedTurn(
            content=record.content,
            reasoning_content=record.reasoning_content,
            tool_calls=record.tool_calls,
        ),
        finish_reason=record.finish_reason,
        source=prompt.source,
        category=prompt.category,
        usage=record.usage,
        spec=record.spec,
        tools=prompt.tools,
        model=record.model,
    )


def conversation_sample(record: Conversation) -> ConversationSample:
    prompt = record.prompt
    return ConversationSample(
        id=record.id, run=record.run, settings_hash=record.settings_hash,
        messages=final_transcript(prompt.messages, record.steps), steps=record.steps,
        outcome=record.outcome, source=prompt.source, category=prompt.category,
        tools=prompt.tools, model=record.steps[-1].model if record.steps else "")


def encode_line(sample: TrainingSample | ConversationSample) -> bytes:
    """One JSONL line, newline included."""
    return _encoder.encode(sample) + b"\n"


def sample_line(record: Completion) -> bytes:
    return encode_line(to_sample(record))


_line_decoder = msgspec.json.Decoder(TrainingSample)


def decode_line(line: bytes) -> TrainingSample:
    return _line_decoder.decode(line)


# -- the hot path ---------------------------------------------------------------------


# gc=False: these never take part in reference cycles, and untracked objects
# keep the collector out of the hot path.
class PromptView(msgspec.Struct, frozen=True, gc=False):
    messages: Raw
    source: str
    category: str
    tools: Raw = Raw(NULL)


class CompletionView(msgspec.Struct, frozen=True, gc=False, tag="completion",
                     tag_field="kind"):
    """`schemas.Completion` with the bulky parts left as raw JSON."""

    id: str
    run: str
    settings_hash: str
    prompt: PromptView
    finish_reason: str
    content: str | None = None
    reasoning_content: Raw = Raw(NULL)
    tool_calls: tuple[ToolCall, ...] | None = None
    usage: Usage = Usage()
    spec: SpecStats = SpecStats()
    model: str = ""


_view_decoder: msgspec.json.Decoder[CompletionView | Failure | Conversation] = (
    msgspec.json.Decoder(CompletionView | Failure | Conversation))


def decode_view(raw: bytes) -> CompletionView | Failure | Conversation:
    return _view_decoder.decode(raw)


# A JSON string literal that shows a visible ASCII character before any
# other: escapes, spaces and non-ASCII bytes skipped (never concluded from).
_VISIBLE = re.compile(rb'"(?:\\u[0-9A-Fa-f]{4}|\\[^u]|[ \x80-\xff])*[\x21\x23-\x5b\x5d-\x7e]')
_str_or_none = msgspec.json.Decoder(str | None)


def is_null(raw: Raw) -> bool:
    return len(raw) == len(NULL) and bytes(raw) == NULL


def raw_text_present(raw: Raw) -> bool:
    """Exactly `bool(text and text.strip())` for the JSON text `raw`, mostly
    without decoding it."""
    if is_null(raw):
        return False
    if _VISIBLE.match(raw):
        return True
    text = _str_or_none.decode(raw)  # rare: blank, or no ASCII before non-ASCII text
    return bool(text and text.strip())


class _TurnWire(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """`schemas.sample.GeneratedTurn` (role omitted as its default)."""

    content: str | UnsetType = UNSET
    reasoning_content: Raw | UnsetType = UNSET
    tool_calls: tuple[ToolCall, ...] | UnsetType = UNSET


class _SampleWire(msgspec.Struct, frozen=True, gc=False):
    """`schemas.TrainingSample`, same fields in the same order, raw parts verbatim."""

    id: str
    run: str
    settings_hash: str
    messages: Raw
    completion: _TurnWire
    finish_reason: str
    source: str
    category: str
    usage: Usage
    spec: SpecStats
    tools: Raw
    model: str
    v: int = 1


def _wire(view: CompletionView) -> _SampleWire:
    reasoning = view.reasoning_content
    prompt = view.prompt
    return _SampleWire(
        view.id, view.run, view.settings_hash, prompt.messages,
        _TurnWire(UNSET if view.content is None else view.content,
                  UNSET if is_null(reasoning) else reasoning,
                  UNSET if view.tool_calls is None else view.tool_calls),
        view.finish_reason, prompt.source, prompt.category, view.usage, view.spec, prompt.tools,
        view.model,
    )


def write_line(view: CompletionView, buffer: bytearray) -> None:
    """Append the sample's JSONL line (newline included) to `buffer`."""
    _encoder.encode_into(_wire(view), buffer, -1)
    buffer += b"\n"


class LineEncoder:
    """Encodes sample lines into a reused buffer: one copy per line, no
    buffer growth after the first few. One per thread (the consumer's)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def line(self, view: CompletionView) -> bytes:
        """The sample's JSONL line, newline included."""
        _encoder.encode_into(_wire(view), self._buffer, 0)
        self._buffer.append(10)
        return bytes(self._buffer)


def view_line(view: CompletionView) -> bytes:
    buffer = bytearray()
    write_line(view, buffer)
    return bytes(buffer)
