"""A dead-letter record on `tokenmill.<run>.dlq`.

The value is this envelope around the completion record as read from
`.completions`; the reason and the source position travel in headers (the way
Kafka Connect's DLQ does) and, for readers that ignore headers, in the
envelope's fields. A record that could not be decoded as a completion of the
run (reason `invalid`) has no `record`; `raw` keeps its key and value.
"""

from __future__ import annotations

import msgspec

from schemas.completion import CompletionRecord
from schemas.raw import RawRecord

# Header names, modelled on Kafka Connect's `__connect.errors.*` headers.
HEADER_REASON = "tokenmill.dlq.reason"
HEADER_DETAIL = "tokenmill.dlq.detail"
HEADER_TOPIC = "tokenmill.dlq.source.topic"
HEADER_PARTITION = "tokenmill.dlq.source.partition"
HEADER_OFFSET = "tokenmill.dlq.source.offset"


class DeadLetter(msgspec.Struct, frozen=True):
    id: str
    run: str
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    record: CompletionRecord | None
    raw: RawRecord | None = None
    v: int = 1
