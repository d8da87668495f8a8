"""Facts derived from a request's prompt: token estimate, cache prefixes, answer key.

The answer key is a BLAKE2b hash (never Python's ``hash()``) of the server
seed, the thinking switch, the request's sampling ``seed`` and the canonical
JSON of messages and tools, so the same prompt gets the same answer in every
process, also after a restart. ``max_tokens`` is not part of the key: a
shorter budget cuts the same answer earlier.
"""

from __future__ import annotations

import hashlib

import msgspec

from sglang_sim import tokens
from sglang_sim.protocol import ChatCompletionRequest, Message

_ENC = msgspec.json.Encoder()
_MAX_CACHE_ENTRIES = 500_000


class PromptFacts(msgspec.Struct, kw_only=True):
    key: bytes  # 32-byte answer key
    prompt_key: bytes  # 16-byte key of messages + tools only (fault attempts)
    message_chars: list[int]
    tools_chars: int
    prompt_tokens: int
    prefix_hashes: list[bytes]  # hash of messages[:k+1], k = 0..n-1


def message_chars(message: Message) -> int:
    """Characters of a message that the token estimate counts."""
    content = message.content
    if content is None:
        chars = 0
    elif isinstance(content, str):
        chars = len(content)
    else:
        chars = sum(len(part.text) for part in content if part.text)
    if message.tool_calls is not None:
        chars += len(msgspec.json.encode(message.tool_calls))
    return chars


def thinking_enabled(request: ChatCompletionRequest) -> bool:
    """Qwen3 semantics: thinking is on unless enable_thinking is False (or effort none)."""
    kwargs = request.chat_template_kwargs
    if kwargs is not None and kwargs.get("enable_thinking") is False:
        return False
    return request.reasoning_effort != "none"


def facts(request: ChatCompletionRequest, server_seed: int, thinking: bool) -> PromptFacts:
    """Hashes and token counts for one request (a few microseconds)."""
    chars = [message_chars(m) for m in request.messages]
    tools_json = _ENC.encode(request.tools) if request.tools else b""
    prefix: list[bytes] = []
    h = hashlib.blake2b(tools_json, digest_size=16)
    for message in request.messages:
        h.update(_ENC.encode(message))
        prefix.append(h.digest())
    prompt_key = prefix[-1] if prefix else h.digest()
    sampling_seed = request.seed if request.seed is not None else -1
    key = hashlib.blake2b(
        prompt_key
        + server_seed.to_bytes(8, "big", signed=True)
        + sampling_seed.to_bytes(8, "big", signed=True)
        + (b"T" if thinking else b"F"),
        digest_size=32,
    ).digest()
    return PromptFacts(
        key=key,
        prompt_key=prompt_key,
        message_chars=chars,
        tools_chars=len(tools_json),
        prompt_tokens=tokens.prompt_tokens(chars, len(tools_json)),
        prefix_hashes=prefix,
    )


class PrefixCache:
    """A stand-in for SGLang's radix cache: remembers message prefixes it has seen."""

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def lookup_and_insert(self, f: PromptFacts) -> int:
        """Cached prompt tokens for this request, then remember its prefixes."""
        cached = 0
        n = len(f.prefix_hashes)
        for k in range(n - 1, -1, -1):
            if f.prefix_hashes[k] in self._seen:
                if k == n - 1:
                    cached = f.prompt_tokens - 1  # whole prompt seen; last token recomputed
                else:
                    cached = tokens.prefix_tokens(f.message_chars, f.tools_chars, k + 1)
                break
        if len(self._seen) > _MAX_CACHE_ENTRIES:
            self._seen.clear()
        self._seen.update(f.prefix_hashes)
        return max(cached, 0)
