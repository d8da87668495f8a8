"""Dead-letter records: value = `schemas.DeadLetter` JSON, key = prompt id,
reason and source position in headers (Kafka Connect's DLQ style) and in the
envelope, for readers that ignore headers.

The envelope embeds the completion record byte for byte as it was read
(`msgspec.Raw`), so it decodes as `schemas.DeadLetter` and nothing of the
original is lost or re-encoded.
"""

from __future__ import annotations

import msgspec

from schemas import CompletionRecord
from schemas.dlq import (
    HEADER_DETAIL,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_TOPIC,
)
from schemas.raw import RawRecord
from sink.batcher import DeadLetterOut
from sink.samples import CompletionView


class _DeadLetterWire(msgspec.Struct, frozen=True):
    """`schemas.DeadLetter` with the record kept as raw JSON (same fields, same order)."""

    id: str
    run: str
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    record: msgspec.Raw
    raw: RawRecord | None = None
    v: int = 1


_encoder = msgspec.json.Encoder()


def headers(reason: str, detail: str, topic: str, partition: int,
            offset: int) -> list[tuple[str, bytes]]:
    return [
        (HEADER_REASON, reason.encode()),
        (HEADER_DETAIL, detail.encode()),
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
    ]


def dead_letter(record: CompletionRecord | CompletionView, raw: bytes, *, reason: str, detail: str,
                topic: str, partition: int, offset: int) -> DeadLetterOut:
    """The DLQ record for `record`, whose bytes as read are `raw`."""
    envelope = _DeadLetterWire(
        id=record.id, run=record.run, reason=reason, detail=detail, source_topic=topic,
        source_partition=partition, source_offset=offset, record=msgspec.Raw(raw),
    )
    return DeadLetterOut(
        key=record.id.encode(),
        value=_encoder.encode(envelope),
        headers=headers(reason, detail, topic, partition, offset),
        reason=reason,
    )


INVALID = "invalid"
_NULL = msgspec.Raw(b"null")


def invalid_letter(raw: RawRecord, *, run: str, detail: str) -> DeadLetterOut:
    """The DLQ record for a `.completions` record that is not a completion of
    the run: no decoded record, the bytes as read in `raw`. Its key is the
    record's own (bytes-safe), else its position."""
    record_id = f"invalid:{raw.topic}:{raw.partition}:{raw.offset}"
    envelope = _DeadLetterWire(
        id=record_id, run=run, reason=INVALID, detail=detail, source_topic=raw.topic,
        source_partition=raw.partition, source_offset=raw.offset, record=_NULL, raw=raw)
    return DeadLetterOut(
        key=raw.key if raw.key is not None else record_id.encode(),
        value=_encoder.encode(envelope),
        headers=headers(INVALID, detail, raw.topic, raw.partition, raw.offset),
        reason=INVALID,
    )
