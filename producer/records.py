"""The wire form of a prompt, split so `seq` is filled in at publish time.

`seq` (the publish-order index) is known only after pass 1 has counted every
bucket. Rather than decode and re-encode a million records in pass 2, pass 1
encodes the whole `PromptRecord` with seq=0 and keeps the bytes before the
`"seq"` field; pass 2 appends `,"seq":N,"v":1}`. `finish` produces exactly
what `msgspec.json.encode(PromptRecord(..., seq=N))` would (a test checks it).
"""

from __future__ import annotations

import msgspec

from schemas.prompt import PromptRecord
from tokenmill.topics import MAX_MESSAGE_BYTES

_encoder = msgspec.json.Encoder()
_SUFFIX = b',"seq":0,"v":1}'
# Room for the seq digits, the key and the record's overhead in a batch.
MAX_RECORD_BYTES = MAX_MESSAGE_BYTES - 4096


def prefix(record: PromptRecord) -> bytes:
    """The encoded record up to (not including) its `seq` field."""
    if record.seq != 0 or record.v != 1:
        raise ValueError("encode prompts with seq=0 and v=1; seq is set at publish time")
    data = _encoder.encode(record)
    if not data.endswith(_SUFFIX):  # pragma: no cover - guards a schema change
        raise AssertionError("PromptRecord no longer ends with seq, v: update producer/records.py")
    return data[: -len(_SUFFIX)]


def finish(record_prefix: bytes, seq: int) -> bytes:
    return b'%s,"seq":%d,"v":1}' % (record_prefix, seq)
