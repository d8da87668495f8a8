"""Wire shapes of SGLang's OpenAI-compatible chat API, as msgspec Structs.

Field names, defaults and null-vs-absent choices follow SGLang's
``python/sglang/srt/entrypoints/openai/protocol.py`` (pydantic there): unknown
request fields are ignored, response fields SGLang serializes as ``null`` are
kept as ``None``, and fields SGLang drops when unset (``meta_info``) use
``msgspec.UNSET``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

# ---------------------------------------------------------------- requests


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None


class ToolFunction(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool = False


class Tool(msgspec.Struct, kw_only=True):
    type: str = "function"
    function: ToolFunction


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatCompletionRequest(msgspec.Struct, kw_only=True):
    """The fields the simulator reads; every other field is accepted and ignored."""

    messages: list[Message]
    model: str = "default"
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    rid: str | list[str] | None = None
    return_meta_info: bool = False
    separate_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | float | None = None
    ignore_eos: bool = False
    no_stop_trim: bool = False


VALID_ROLES = frozenset(
    {"system", "user", "assistant", "tool", "function", "developer", "latest_reminder"}
)

# --------------------------------------------------------------- responses


class FunctionResponse(msgspec.Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    index: int
    type: str = "function"
    function: FunctionResponse


class ChatMessage(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    message: ChatMessage
    logprobs: None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    meta_info: dict[str, Any] | UnsetType = UNSET


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class UsageInfo(msgspec.Struct, kw_only=True):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    reasoning_tokens: int = 0


class ChatCompletionResponse(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    metadata: dict[str, Any] | None = None


class DeltaMessage(msgspec.Struct, kw_only=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class StreamChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: DeltaMessage
    logprobs: None = None
    finish_reason: str | None = None
    matched_stop: int | str | None = None


class ChatCompletionStreamResponse(msgspec.Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[StreamChoice]
    usage: UsageInfo | None = None


class ErrorResponse(msgspec.Struct, kw_only=True):
    object: str = "error"
    message: str
    type: str
    param: str | None = None
    code: int


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "sglang"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(msgspec.Struct, kw_only=True):
    object: str = "list"
    data: list[ModelCard]


ENCODER = msgspec.json.Encoder()
REQUEST_DECODER = msgspec.json.Decoder(ChatCompletionRequest)


def error_body(message: str, err_type: str = "BadRequestError", code: int = 400) -> bytes:
    """SGLang's OpenAI-style error body (create_error_response in SGLang)."""
    return ENCODER.encode(ErrorResponse(message=message, type=err_type, code=code))
