"""Stable prompt ids and the duplicate filter.

The id is a hash of what the model will see (normalized messages and tools),
not of where the prompt came from: the same prompt in two files, or in a
parent run and its replay, has the same id. Keys are encoded with sorted
fields and keys, so dict order in a dataset's tool specs does not matter.
"""

from __future__ import annotations

import hashlib

import msgspec

from schemas.messages import Message, Tool

_encoder = msgspec.json.Encoder(order="sorted")


def prompt_id(messages: tuple[Message, ...], tools: tuple[Tool, ...] | None) -> tuple[str, int]:
    """(id, dedupe key): sha256 of the canonical encoding, 32 hex chars, and
    its first 8 bytes as an int."""
    digest = hashlib.sha256(_encoder.encode((messages, tools))).digest()
    return digest[:16].hex(), int.from_bytes(digest[:8], "big")


class SeenIds:
    """Dedupe on 64-bit keys: ~70 bytes per id in a Python set (about 70 MB
    for a million prompts) instead of a set of strings. Two different prompts
    share a key with probability ~n^2/2^65 (3e-8 for a million)."""

    def __init__(self) -> None:
        self._keys: set[int] = set()

    def add(self, key: int) -> bool:
        """True if new; False if this key was seen before."""
        keys = self._keys
        if key in keys:
            return False
        keys.add(key)
        return True

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)
