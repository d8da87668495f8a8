"""What the consumer commits to `tokenmill.<run>.completions`: one record per
published prompt, either a `Completion` or a `Failure` (tagged by `kind`).

Each embeds its prompt, so the sink can write self-contained training samples
without a join. A prompts-topic record that is not a valid prompt of the run
becomes a `Failure` of kind `invalid` that keeps the record as read (`raw`);
the sink sends it to the dead-letter topic with reason `invalid`.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.messages import ToolCall
from schemas.prompt import PromptRecord
from schemas.raw import RawRecord


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0


class SpecStats(msgspec.Struct, frozen=True, omit_defaults=True):
    """Per-request speculative decoding stats (SGLang `meta_info`)."""

    accept_length: float | None = None
    verify_ct: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None


class Completion(msgspec.Struct, frozen=True, tag="completion", tag_field="kind"):
    id: str
    run: str
    settings_hash: str
    prompt: PromptRecord
    finish_reason: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    matched_stop: int | str | None = None
    usage: Usage = Usage()
    spec: SpecStats = SpecStats()
    latency_s: float = 0.0
    attempts: int = 1
    instance: str = ""
    model: str = ""
    v: int = 1


FailureKind = Literal["prompt_too_long", "bad_request", "server_error", "timeout", "abort",
                      "invalid_response", "invalid"]


class Failure(msgspec.Struct, frozen=True, tag="failure", tag_field="kind"):
    id: str
    run: str
    settings_hash: str
    prompt: PromptRecord
    failure: FailureKind
    error: str
    status: int | None = None
    attempts: int = 1
    instance: str = ""
    latency_s: float = 0.0
    raw: RawRecord | None = None  # kind "invalid": the prompts-topic record as read
    v: int = 1


CompletionRecord = Completion | Failure

_decoder = msgspec.json.Decoder(CompletionRecord)
_encoder = msgspec.json.Encoder()


def decode_completion(data: bytes) -> CompletionRecord:
    return _decoder.decode(data)


def encode_record(record: msgspec.Struct) -> bytes:
    return _encoder.encode(record)
