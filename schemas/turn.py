"""A conversation between two turns, on `tokenmill.<run>.turns`.

A `regenerate-turns` worker that generated a step commits this record (the
conversation so far) with the step's input offset in one transaction; any
worker reading it generates the next step. The next request's messages are
derived from `prompt` and `steps` (consumer/turns.py), so what a request
carries is exactly what was generated before it.
"""

from __future__ import annotations

import msgspec

from schemas.completion import Step
from schemas.prompt import PromptRecord


class TurnRecord(msgspec.Struct, frozen=True, tag="turn", tag_field="kind"):
    id: str  # the conversation's (the turn-0 prompt's) id
    run: str
    settings_hash: str
    prompt: PromptRecord  # the dataset conversation, as published
    steps: tuple[Step, ...]  # generated so far, in order
    next_turn: int  # user turn the next request answers (0-based)
    v: int = 1


_decoder = msgspec.json.Decoder(TurnRecord)


def decode_turn(data: bytes) -> TurnRecord:
    return _decoder.decode(data)
