"""Stable prompt ids and the duplicate filter.

The id is a hash of what the model will see (normalized messages and tools),
not of where the prompt came from: the same prompt in two files, or in a
parent run and its replay, has the same id. Tool specs are hashed with sorted
keys, so dict order in a dataset's tool specs does not matter.
"""

from __future__ import annotations

import hashlib

import msgspec

from schemas.messages import Message, Tool

_messages_encoder = msgspec.json.Encoder()
_tools_encoder = msgspec.json.Encoder(order="sorted")


def encode_messages(messages: tuple[Message, ...]) -> bytes:
    """Canonical already: fields in the Struct's order, defaults omitted. The
    same bytes go into the published record, so they are encoded once."""
    return _messages_encoder.encode(messages)


def prompt_id(messages_json: bytes, tools: tuple[Tool, ...] | None) -> tuple[str, int]:
    """(id, dedupe key): the id is the first 32 hex chars of the sha256 of the
    encoded messages (plus a newline and the tools with sorted keys when there
    are tools); the key is its first 64 bits as an int, so which prompts count
    as duplicates is the same on every run (a resumed run must rebuild the same
    publish order)."""
    digest = hashlib.sha256(messages_json)
    if tools:
        digest.update(b"\n" + _tools_encoder.encode(tools))
    pid = digest.hexdigest()[:32]
    return pid, int(pid[:16], 16)


class SeenIds(set[int]):
    """Dedupe on 64-bit keys: ~70 bytes per id in a set of ints (about 70 MB
    for a million prompts) instead of a set of strings. Two different prompts
    share a key with probability ~n^2/2^65 (3e-8 for a million). A plain set,
    so the hot loop uses its C methods directly."""
