"""Input files -> a stream of (line, record) pairs, never loading a file whole.

A record is the raw JSON bytes of one line (JSONL) or one array element
(JSON array), or a dict (one Parquet row). Problems that belong to one record
(a line too long to hold, an array cut short) come out as a `ReadProblem` in
the record's place, so the caller rejects that record and keeps going.
Problems with the whole file (missing, unreadable, corrupt compression) raise
`InputError` naming the file.

The container is recognized by its first bytes, not its name: gzip and zstd
magic numbers, Parquet's `PAR1`, and `[` for a JSON array (else JSONL).
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import zstandard

from producer.errors import InputError

# A single record above this is rejected without being held in memory. Larger
# than Kafka's message limit on purpose: a record may shrink (the final
# assistant turn is dropped by the multi-turn policy).
MAX_RECORD_BYTES = 64 * 1024 * 1024
CHUNK = 1024 * 1024
PARQUET_BATCH_ROWS = 2048

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class ReadProblem:
    """A record that could not be cut out of the file; becomes a reject."""

    reason: str
    detail: str


Record = bytes | dict[str, Any] | ReadProblem


def check_readable(path: Path) -> None:
    """Raise InputError unless `path` is a readable regular file."""
    if not path.exists():
        raise InputError(f"input file not found: {path}")
    if not path.is_file():
        raise InputError(f"input is not a regular file: {path}")
    if not os.access(path, os.R_OK):
        raise InputError(f"input file is not readable (permission denied): {path}")


def sniff(path: Path) -> str:
    """Container kind from the first bytes: gzip, zstd, parquet or plain."""
    with path.open("rb") as fh:
        head = fh.read(4)
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    return "plain"


class InputReader:
    """Iterates the records of one file; `position` is the number of file bytes
    consumed so far (compressed bytes for compressed files), for progress."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = path.stat().st_size
        self.kind = sniff(path) if self.size else "plain"
        self._raw: IO[bytes] | None = None
        self._parquet_fraction = 0.0

    @property
    def position(self) -> int:
        if self.kind == "parquet":
            return int(self.size * self._parquet_fraction)
        if self._raw is None or self._raw.closed:
            return 0
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return 0

    def __iter__(self) -> Iterator[tuple[int, Record]]:
        return self._parquet() if self.kind == "parquet" else self._text()

    def _text(self) -> Iterator[tuple[int, Record]]:
        try:
            with self.path.open("rb") as raw:
                self._raw = raw
                stream = _decompressed(raw, self.kind)
                head = _skip_bom_and_space(stream)
                if head == b"[":
                    yield from split_json_array(stream)
                else:
                    yield from split_lines(stream)
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
            raise InputError(f"cannot read {self.path} ({self.kind}): {exc}") from None

    def _parquet(self) -> Iterator[tuple[int, Record]]:
        try:
            import pyarrow.parquet as pq
        except ImportError:  # pragma: no cover - pyarrow is in the dev extra
            raise InputError(
                f"{self.path} is Parquet: install pyarrow (pip install 'tokenmill[parquet]')"
            ) from None
        try:
            parquet = pq.ParquetFile(self.path)
            total = max(parquet.metadata.num_rows, 1)
            row = 0
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                for values in batch.to_pylist():
                    row += 1
                    yield row, values
                self._parquet_fraction = row / total
        except Exception as exc:  # pyarrow raises its own error types
            if isinstance(exc, (InputError, GeneratorExit)):
                raise
            raise InputError(f"cannot read {self.path} (parquet): {exc}") from None


def _decompressed(raw: IO[bytes], kind: str) -> IO[bytes]:
    """A buffered binary stream of the decompressed bytes (fast `readline`)."""
    stream: Any
    if kind == "gzip":
        stream = gzip.GzipFile(fileobj=raw, mode="rb")
    elif kind == "zstd":
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_size=CHUNK,
                                                           read_across_frames=True)
    elif isinstance(raw, io.BufferedReader):
        return raw
    else:
        stream = raw
    return io.BufferedReader(stream, CHUNK)


def _skip_bom_and_space(stream: IO[bytes]) -> bytes:
    """Peek the first meaningful byte without consuming it (BOM is consumed)."""
    assert isinstance(stream, io.BufferedReader)
    head = stream.peek(3)[:3]
    if head.startswith(BOM):
        stream.read(3)
    while True:
        peeked = stream.peek(1)
        if not peeked:
            return b""
        stripped = peeked.lstrip()
        if stripped:
            return stripped[:1]
        stream.read(len(peeked))


def split_lines(stream: IO[bytes], limit: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, Record]]:
    """JSONL: one record per non-blank line; over-long lines become problems."""
    readline = stream.readline
    line_no = 0
    while True:
        line = readline(limit + 1)
        if not line:
            return
        line_no += 1
        if len(line) > limit and not line.endswith(b"\n"):
            while True:  # discard the rest of the line without holding it
                rest = readline(CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
            yield line_no, ReadProblem("too-large", f"line longer than {limit} bytes")
            continue
        if line.isspace():
            continue
        yield line_no, line


# Inside an array element only strings and brackets matter: find the next
# structural byte, and inside a string the end of its body (escapes whole).
_STRUCT = re.compile(rb'["\[\]{}]')
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\.)*+')
_SPACE = re.compile(rb"[ \t\r\n]*")
_SCALAR_END = re.compile(rb"[,\]\s]")


class _Buffer:
    """A growing window over the stream; indices are absolute stream offsets."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.data = b""
        self.base = 0  # stream offset of data[0]
        self.eof = False

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def more(self, keep_from: int) -> bool:
        """Read more, dropping bytes before `keep_from`; False at end of stream."""
        if self.eof:
            return False
        drop = keep_from - self.base
        if drop > 0:
            self.data = self.data[drop:]
            self.base = keep_from
        chunk = self.stream.read(max(CHUNK, len(self.data)))  # doubles: linear in total
        if not chunk:
            self.eof = True
            return False
        self.data += chunk
        return True

    def byte(self, at: int) -> bytes:
        return self.data[at - self.base : at - self.base + 1]

    def skip_space(self, at: int) -> int:
        while True:
            m = _SPACE.match(self.data, at - self.base)
            assert m is not None
            at = self.base + m.end()
            if at < self.end or not self.more(at):
                return at


def split_json_array(stream: IO[bytes],
                     limit: int = MAX_RECORD_BYTES) -> Iterator[tuple[int, Record]]:
    """Top-level JSON array -> its elements' bytes, one at a time.

    The stream must be positioned at the opening `[`. Elements are cut out by
    bracket depth (strings skipped whole), not parsed: a malformed element is
    still cut out and rejected by the JSON decoder later, and its neighbours
    survive. Line numbers are 1-based element indices."""
    buf = _Buffer(stream)
    buf.more(0)
    pos = buf.skip_space(0) + 1  # past '['
    index = 0
    while True:
        pos = buf.skip_space(pos)
        head = buf.byte(pos)
        if head == b"]":
            return
        if head == b"," and index > 0:
            pos = buf.skip_space(pos + 1)
            head = buf.byte(pos)
        if not head:
            yield index + 1, ReadProblem("truncated", "JSON array ends without its closing ']'")
            return
        index += 1
        end, problem = _element_end(buf, pos, limit)
        if problem is not None:
            yield index, problem
            if end is None:
                return
        else:
            assert end is not None
            yield index, buf.data[pos - buf.base : end - buf.base]
        pos = end


def _element_end(buf: _Buffer, start: int,
                 limit: int) -> tuple[int | None, ReadProblem | None]:
    """End offset of the element at `start`; a problem if too large or cut short.

    State is (depth, inside a string), so an oversized element is skipped while
    holding only the current chunk, even inside one huge string."""
    if buf.byte(start) not in (b"{", b"[", b'"'):
        return _scalar_end(buf, start)
    depth = 0
    in_string = False
    at = start  # absolute offset of the next unscanned byte
    too_large = False
    while True:
        at, depth, in_string, closed = _scan(buf.data, buf.base, at, depth, in_string)
        if closed:
            return at, (ReadProblem("too-large", f"record larger than {limit} bytes")
                        if too_large else None)
        if not too_large and at - start > limit:
            too_large = True  # keep scanning for its end, holding nothing
        if not buf.more(at if too_large else start):
            return None, ReadProblem("truncated", "JSON array ends inside this element")


def _scan(data: bytes, base: int, at: int, depth: int,
          in_string: bool) -> tuple[int, int, bool, bool]:
    """Scan the buffered `data` (stream offset `base`) from `at` toward the end
    of an element: the offset reached, the depth and string state there, and
    whether the element closed (then the offset is just past it)."""
    while True:
        if in_string:
            m = _STRING_BODY.match(data, at - base)
            assert m is not None
            stop = m.end()
            if stop >= len(data) or data[stop] != 0x22:
                # the body runs past the buffer (or ends in a lone '\\')
                return base + stop, depth, True, False
            in_string = False
            at = base + stop + 1
            if depth == 0:
                return at, depth, False, True
            continue
        m = _STRUCT.search(data, at - base)
        if m is None:
            return base + len(data), depth, False, False
        at = base + m.end()
        char = data[m.start()]
        if char == 0x22:
            in_string = True
        elif char in (0x7B, 0x5B):  # { [
            depth += 1
        else:
            depth -= 1
            if depth <= 0:
                return at, depth, False, True


def _scalar_end(buf: _Buffer, start: int) -> tuple[int | None, ReadProblem | None]:
    while True:
        m = _SCALAR_END.search(buf.data, start - buf.base)
        if m is not None:
            return buf.base + m.start(), None
        if not buf.more(start):
            return buf.end, None
