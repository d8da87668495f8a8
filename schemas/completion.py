"""What the consumer commits to `tokenmill.<run>.completions`: one record per
published prompt, a `Completion`, a `Failure` or (`regenerate-turns` runs) a
`Conversation` (tagged by `kind`).

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
from schemas.step import SpecStats as SpecStats
from schemas.step import Step as Step
from schemas.step import Usage as Usage


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


# How a conversation ended: every user turn answered, or a tool call the
# dataset (and the --tool-results hook) could not answer, or the tool-call
# round limit of one user turn reached.
ConversationOutcome = Literal["finished", "tool_unresolved", "tool_limit"]


class Conversation(msgspec.Struct, frozen=True, tag="conversation", tag_field="kind"):
    """A finished `regenerate-turns` conversation: every step the model
    generated, in order. `prompt.messages` is the dataset conversation the
    user turns and tool results were taken from (its assistant turns were
    never sent)."""

    id: str
    run: str
    settings_hash: str
    prompt: PromptRecord
    steps: tuple[Step, ...]
    outcome: ConversationOutcome = "finished"
    v: int = 1


FailureKind = Literal["prompt_too_long", "bad_request", "server_error", "timeout", "abort",
                      "invalid_response", "invalid", "invalid_tool_call", "tool_hook_error"]


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
    # A conversation (`regenerate-turns`) that failed at request `step`: the
    # steps generated before it, so the dead letter shows where it stopped.
    step: int | None = None
    steps: tuple[Step, ...] = ()
    v: int = 1


CompletionRecord = Completion | Failure | Conversation

_decoder = msgspec.json.Decoder(CompletionRecord)
_encoder = msgspec.json.Encoder()


def decode_completion(data: bytes) -> CompletionRecord:
    return _decoder.decode(data)


def encode_record(record: msgspec.Struct) -> bytes:
    return _encoder.encode(record)
