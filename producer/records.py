"""The wire form of a prompt, split so `seq` is filled in at publish time.

`seq` (the publish-order index) is known only after pass 1 has counted every
bucket. Rather than decode and re-encode a million records in pass 2, pass 1
keeps the encoded record up to its `"seq"` field and pass 2 appends
`,"seq":N,"v":1}`. Pass 1 assembles that prefix from parts (the messages are
encoded once, for both the id and the record), so `assemble` + `finish` must
produce exactly what `msgspec.json.encode(PromptRecord(...))` would: a test
checks it, and `prefix` is the reference.
"""

from __future__ import annotations

import msgspec

from schemas.prompt import PromptRecord
from tokenmill.kafka.topics import MAX_MESSAGE_BYTES

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


_strings: dict[str, bytes] = {}


def json_string(value: str) -> bytes:
    """JSON text of a string; the few distinct values (formats, categories,
    sources) are cached."""
    encoded = _strings.get(value)
    if encoded is None:
        encoded = _strings[value] = _encoder.encode(value)
    return encoded


def assemble(pid: str, run: bytes, messages: bytes, source: bytes, fmt: bytes, category: bytes,
             line: int, turn: int | None, tools: bytes) -> bytes:
    """The prefix of an encoded PromptRecord from its encoded parts (JSON text
    for run, messages, source, format, category and tools)."""
    return b'{"id":"%s","run":%s,"messages":%s,"source":%s,"format":%s,"category":%s,' \
           b'"line":%d,"turn":%s,"tools":%s' % (
               pid.encode(), run, messages, source, fmt, category, line,
               b"null" if turn is None else b"%d" % turn, tools)


def spool_line(pid: bytes, run: bytes, messages: bytes, source: bytes, fmt: bytes,
               category: bytes, line: int, turn: int | None, tools: bytes) -> bytes:
    """A spool line in one step: the id (the Kafka key), the record's prefix
    as `assemble` makes it, a newline (see spool.py)."""
    return b'%b{"id":"%b","run":%b,"messages":%b,"source":%b,"format":%b,"category":%b,' \
           b'"line":%d,"turn":%b,"tools":%b\n' % (
               pid, pid, run, messages, source, fmt, category, line,
               b"null" if turn is None else b"%d" % turn, tools)


SPOOL_OVERHEAD = 33  # id and newline around the prefix in a spool line


def encode_tools(tools: object) -> bytes:
    return _encoder.encode(tools)


def finish(record_prefix: bytes, seq: int) -> bytes:
    return b'%b,"seq":%d,"v":1}' % (record_prefix, seq)


def finish_line(spool_line: bytes, seq: int) -> tuple[bytes, bytes]:
    """(key, value) from a spool line: id, prefix, newline (see spool.py)."""
    return spool_line[:32], b'%b,"seq":%d,"v":1}' % (
        memoryview(spool_line)[32:-1], seq)  # type: ignore[str-format]  # %b takes buffers
