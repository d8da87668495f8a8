"""Writing one shard: samples (or conversations) in, a staged file with its
size and SHA-256 out. A conversation that is not exported (a partial one,
`conversations.exportable`) is counted as left out instead of written.

JSONL shards stream each line to the file as it comes. Parquet shards hold
one row group at a time (`ROW_GROUP_ROWS` rows or `ROW_GROUP_BYTES` of
encoded rows, whichever first) and hand it to pyarrow's ParquetWriter, so memory
stays bounded whatever the shard size.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO

from ops.export import conversations, formats
from ops.export.manifest import RunStats
from schemas import TrainingSample
from schemas.sample import ConversationSample

ROW_GROUP_ROWS = 10_000
ROW_GROUP_BYTES = 16 * 1024 * 1024
WRITE_BUFFER = 1024 * 1024


class ShardWriter:
    """Base: counts and per-run statistics; subclasses write the bytes.
    `include_partial`: conversations only (`conversations.exportable`)."""

    def __init__(self, path: Path, include_partial: bool = False) -> None:
        self.path = path
        self.records = 0  # rows written
        self.left_out = 0  # accepted conversations without a row
        self.include_partial = include_partial
        self.runs: dict[str, RunStats] = {}

    @property
    def results(self) -> int:
        """Accepted results taken: a row each, or left out."""
        return self.records + self.left_out

    def _stats(self, run: str) -> RunStats:
        stats = self.runs.get(run)
        if stats is None:
            stats = self.runs[run] = RunStats()
        return stats

    def add(self, sample: TrainingSample | ConversationSample) -> None:
        if isinstance(sample, ConversationSample):
            self._add_conversation(sample)
            return
        self._stats(sample.run).add(sample)
        self.records += 1
        self._write(sample)

    def _add_conversation(self, sample: ConversationSample) -> None:
        stats = self._stats(sample.run)
        kept = conversations.exportable(sample, self.include_partial)
        if kept is None:
            stats.left_out += 1
            self.left_out += 1
            return
        stats.add_conversation(kept, cut=conversations.partial(kept))
        self.records += 1
        self._write(kept)

    def _write(self, sample: TrainingSample | ConversationSample) -> None:
        raise NotImplementedError

    def finish(self) -> tuple[int, str]:
        """Close the file; (bytes, sha256 hex)."""
        raise NotImplementedError


class JsonlShard(ShardWriter):
    def __init__(self, path: Path, fmt: str, include_partial: bool = False) -> None:
        super().__init__(path, include_partial)
        self._render = formats.LINE_FORMATS[fmt]
        self._render_conversation = conversations.LINE_FORMATS[fmt]
        self._file: IO[bytes] = path.open("wb", buffering=0)
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._buffer = bytearray()

    def _write(self, sample: TrainingSample | ConversationSample) -> None:
        self._buffer += (self._render_conversation(sample)
                         if isinstance(sample, ConversationSample) else self._render(sample))
        if len(self._buffer) >= WRITE_BUFFER:
            self._drain()

    def _drain(self) -> None:
        self._file.write(self._buffer)
        self._hash.update(self._buffer)
        self._bytes += len(self._buffer)
        self._buffer.clear()

    def finish(self) -> tuple[int, str]:
        self._drain()
        self._file.close()
        return self._bytes, self._hash.hexdigest()


class ParquetShard(ShardWriter):
    """Rows are encoded as JSON lines (msgspec) into a buffer; each row group
    is parsed by pyarrow's JSON reader against the fixed schema, in C++, and
    written. The bytes depend only on the rows and the row group size."""

    def __init__(self, path: Path, conversation_rows: bool = False,
                 include_partial: bool = False) -> None:
        import pyarrow.json as pajson
        import pyarrow.parquet as pq

        super().__init__(path, include_partial)
        self._conversations = conversation_rows
        self._schema = (conversations.parquet_schema() if conversation_rows
                        else formats.parquet_schema())
        self._parse = pajson.ParseOptions(explicit_schema=self._schema,
                                          unexpected_field_behavior="error")
        self._read = pajson.read_json
        # Dictionary-encode only the columns with few distinct values: for the
        # texts it costs memory and time, then falls back to plain anyway.
        self._writer = pq.ParquetWriter(str(path), self._schema, compression="zstd",
                                        use_dictionary=list(
                                            conversations.PARQUET_DICTIONARY if conversation_rows
                                            else formats.PARQUET_DICTIONARY))
        self._rows = bytearray()
        self._pending = 0

    def _write(self, sample: TrainingSample | ConversationSample) -> None:
        if isinstance(sample, ConversationSample) != self._conversations:
            raise ValueError("a shard holds samples or conversations, not both")
        self._rows += (conversations.parquet_row(sample) if isinstance(sample, ConversationSample)
                       else formats.parquet_row(sample))
        self._pending += 1
        if self._pending >= ROW_GROUP_ROWS or len(self._rows) >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.json as pajson

        if not self._pending:
            return
        source = pa.BufferReader(pa.py_buffer(self._rows))  # no copy of the rows
        table = self._read(source, parse_options=self._parse,
                           read_options=pajson.ReadOptions(block_size=1 << 24,
                                                           use_threads=False))
        del source  # the buffer must be released before the rows are cleared
        if not table.schema.equals(self._schema):  # the explicit schema gives it as is
            table = table.select(self._schema.names).cast(self._schema)
        self._writer.write_table(table, row_group_size=self._pending)
        del table
        self._rows.clear()
        self._pending = 0

    def finish(self) -> tuple[int, str]:
        self._flush()
        self._writer.close()
        digest = hashlib.sha256()
        size = 0
        with self.path.open("rb") as fh:
            while chunk := fh.read(WRITE_BUFFER):
                digest.update(chunk)
                size += len(chunk)
        return size, digest.hexdigest()


def open_shard(path: Path, fmt: str, conversation_rows: bool = False,
               include_partial: bool = False) -> ShardWriter:
    if fmt == "parquet":
        return ParquetShard(path, conversation_rows, include_partial)
    return JsonlShard(path, fmt, include_partial)
