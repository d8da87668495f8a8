"""Writing one shard: samples in, a staged file with its size and SHA-256 out.

JSONL shards stream each line to the file as it comes. Parquet shards hold
one row group at a time (`ROW_GROUP_ROWS` rows or `ROW_GROUP_BYTES` of
input, whichever first) and hand it to pyarrow's ParquetWriter, so memory
stays bounded whatever the shard size.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import IO, Any

from ops.export import formats
from ops.export.manifest import RunStats
from schemas import TrainingSample

ROW_GROUP_ROWS = 10_000
ROW_GROUP_BYTES = 32 * 1024 * 1024
WRITE_BUFFER = 1024 * 1024


class ShardWriter:
    """Base: counts and per-run statistics; subclasses write the bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records = 0
        self.runs: dict[str, RunStats] = {}

    def add(self, sample: TrainingSample, line: bytes) -> None:
        """`line` is the sample's S3 line (its size bounds a row group)."""
        stats = self.runs.get(sample.run)
        if stats is None:
            stats = self.runs[sample.run] = RunStats()
        stats.add(sample)
        self.records += 1
        self._write(sample, line)

    def _write(self, sample: TrainingSample, line: bytes) -> None:
        raise NotImplementedError

    def finish(self) -> tuple[int, str]:
        """Close the file; (bytes, sha256 hex)."""
        raise NotImplementedError


class JsonlShard(ShardWriter):
    def __init__(self, path: Path, fmt: str) -> None:
        super().__init__(path)
        self._render = formats.LINE_FORMATS[fmt]
        self._file: IO[bytes] = path.open("wb", buffering=0)
        self._hash = hashlib.sha256()
        self._bytes = 0
        self._buffer = bytearray()

    def _write(self, sample: TrainingSample, line: bytes) -> None:
        self._buffer += self._render(sample)
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
    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        super().__init__(path)
        self._schema = formats.parquet_schema()
        self._writer = pq.ParquetWriter(str(path), self._schema, compression="zstd")
        self._rows: list[tuple[Any, ...]] = []
        self._pending_bytes = 0

    def _write(self, sample: TrainingSample, line: bytes) -> None:
        self._rows.append(formats.parquet_row(sample))
        self._pending_bytes += len(line)
        if len(self._rows) >= ROW_GROUP_ROWS or self._pending_bytes >= ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._rows:
            return
        columns = zip(*self._rows)  # rows -> columns, in C
        arrays = [pa.array(values, type=field.type)
                  for field, values in zip(self._schema, columns)]
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self._schema))
        self._rows = []
        self._pending_bytes = 0

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


def open_shard(path: Path, fmt: str) -> ShardWriter:
    return ParquetShard(path) if fmt == "parquet" else JsonlShard(path, fmt)
