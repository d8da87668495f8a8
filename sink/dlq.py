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
