"""A record that could not be used, kept as it was read: the evidence a
dead letter with reason `invalid` carries. Bytes travel as base64 in JSON, so
any byte sequence survives; a value over `RAW_VALUE_MAX` is cut (its size
and digest say what it was) so that the dead letter stays under Kafka's
message limit."""

from __future__ import annotations

import hashlib

import msgspec

RAW_VALUE_MAX = 1024 * 1024


class RawRecord(msgspec.Struct, frozen=True):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # the first RAW_VALUE_MAX bytes
    size: int  # of the whole value; -1 for a null value
    sha256: str  # of the whole value ("" for a null value)

    @property
    def truncated(self) -> bool:
        return self.value is not None and len(self.value) < self.size


def capture(topic: str, partition: int, offset: int, key: bytes | None,
            value: bytes | None) -> RawRecord:
    if value is None:
        return RawRecord(topic, partition, offset, key, None, -1, "")
    return RawRecord(topic, partition, offset, key, value[:RAW_VALUE_MAX], len(value),
                     hashlib.sha256(value).hexdigest())
