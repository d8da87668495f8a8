"""A completion as one self-contained training sample (one JSONL line).

`to_sample` is the definition; `encode_line` writes it. The sink decodes
each record once and encodes each line once, with msgspec (no dicts in
between), which is most of the per-record cost of the sink.
"""

from __future__ import annotations

import msgspec

from schemas import Completion, TrainingSample
from schemas.sample import GeneratedTurn

_encoder = msgspec.json.Encoder()


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


def encode_line(sample: TrainingSample) -> bytes:
    """One JSONL line, newline included."""
    buffer = bytearray()
    _encoder.encode_into(sample, buffer)
    buffer += b"\n"
    return bytes(buffer)


def sample_line(record: Completion) -> bytes:
    return encode_line(to_sample(record))


_line_decoder = msgspec.json.Decoder(TrainingSample)


def decode_line(line: bytes) -> TrainingSample:
    return _line_decoder.decode(line)
