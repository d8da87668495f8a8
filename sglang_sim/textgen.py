"""Deterministic, cheap text: slices of a pre-built word corpus.

The corpus is built once from a fixed vocabulary with a fixed 64-bit
generator (no `random`, no `hash()`), so the same slice gives the same text in
every process and Python version. One "word" (a vocabulary word, possibly
capitalized or ending in a full stop) counts as one completion token; a slice
of ``n`` words is a single string slice, so producing a 4,000-token answer
costs one memcpy.
"""

from __future__ import annotations

import json
from array import array
from functools import lru_cache
from typing import Any

_VOCAB = (  # noqa: SIM905 - a word list reads better as text
    "the of and to in is that for it as with was on be by this are from at or an which "
    "but not have has had were can all their there more one also so some these would "
    "other into its than then only over such first two may any most when what where how "
    "model token answer question data system value function result step check note need "
    "case list number string error time first second next last before after because "
    "therefore however consider assume compute verify return call input output request "
    "server queue batch length limit count total sum small large fast slow simple clear "
    "prompt user reply context reason think plan test example option choice order rule "
    "path file record field type name key item group level state event change update "
    "start stop end begin finish close open read write send receive store load keep "
    "find look show give take make use try let see know mean want seem work run move "
    "good new old same different right wrong true false possible likely exact final "
    "because while until unless although whether either neither both each every few "
    "many much very quite rather just still already again once twice often always never"
).split()

_MASK64 = (1 << 64) - 1


def _splitmix64(state: int) -> tuple[int, int]:
    """One step of SplitMix64: (new_state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


class Corpus:
    """A long run of words with O(1) slicing by word index."""

    __slots__ = ("size", "starts", "text", "window")

    def __init__(self, size: int, seed: int = 0x5EED, window: int = 0) -> None:
        words: list[str] = []
        state = seed
        capital = True
        sentence_left = 0
        n_vocab = len(_VOCAB)
        for _ in range(size):
            state, r = _splitmix64(state)
            word = _VOCAB[r % n_vocab]
            if sentence_left <= 0:
                sentence_left = 6 + (r >> 32) % 15
            if capital:
                word = word.capitalize()
                capital = False
            sentence_left -= 1
            if sentence_left == 0:
                word += "."
                capital = True
            words.append(word)
        self.text = " ".join(words)
        starts = array("I", [0]) * (size + 1)
        pos = 0
        for i, word in enumerate(words):
            starts[i] = pos
            pos += len(word) + 1
        starts[size] = pos  # one past the trailing (virtual) space
        self.starts = starts
        self.size = size
        # offsets wrap within the first `window` words, independent of the count,
        # so a shorter slice at the same offset is a prefix of a longer one
        self.window = window if 0 < window < size else max(size // 2, 1)

    def words(self, offset: int, count: int) -> str:
        """`count` words starting at word `offset` (both wrapped into range)."""
        if count <= 0:
            return ""
        offset %= self.window
        count = min(count, self.size - offset)
        return self.text[self.starts[offset] : self.starts[offset + count] - 1]

    def word_count(self, text: str) -> int:
        """Tokens of a text made by `words` (the simulator's token rule)."""
        return len(text.split()) if text else 0


@lru_cache(maxsize=4)
def corpus_for(max_words: int) -> Corpus:
    """Shared corpus big enough for answers of `max_words` tokens."""
    return Corpus(max(max_words, 1024) + 65536, window=65536)


def _schema_value(schema: Any, r: int, corpus: Corpus, depth: int = 0) -> Any:
    """A value that satisfies a (simple) JSON schema, chosen by `r`."""
    if not isinstance(schema, dict):
        return corpus.words(r, 1)
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[r % len(enum)]
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"] or ["string"]
        kind = kinds[r % len(kinds)]
    if kind == "integer":
        return r % 100
    if kind == "number":
        return (r % 10000) / 100
    if kind == "boolean":
        return bool(r & 1)
    if kind == "array":
        if depth > 3:
            return []
        return [_schema_value(schema.get("items"), r >> 3, corpus, depth + 1)]
    if kind == "object" or "properties" in schema:
        if depth > 3:
            return {}
        return object_arguments(schema, r, corpus, depth + 1)
    return corpus.words(r, 1 + r % 3)


def object_arguments(schema: dict[str, Any], r: int, corpus: Corpus,
                     depth: int = 0) -> dict[str, Any]:
    """Arguments for a tool: every required property plus the first optional one."""
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return {}
    required = [k for k in schema.get("required") or [] if k in props]
    names = required or list(props)[:1]
    out: dict[str, Any] = {}
    for i, name in enumerate(names):
        out[name] = _schema_value(props[name], (r >> (i % 16)) + i * 7919, corpus, depth)
    return out


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The Qwen2.5/Qwen3 tool-call block the model emits (qwen25 parser format)."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"
