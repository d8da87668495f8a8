"""Local spool files between the two passes: one file per bucket, records in
the order pass 1 accepted them.

Frame: 4-byte little-endian payload length, the 32-byte prompt id (the Kafka
key), then the payload (the encoded record up to its `seq`, see records.py).
Pass 2 reads each bucket sequentially, so memory stays flat whatever the
dataset size. The spool is rebuilt from the inputs on every run: it is a
cache of pass 1, never a source of truth.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import IO

_HEADER = struct.Struct("<I")
ID_BYTES = 32
WRITE_BUFFER = 64 * 1024
READ_BUFFER = 256 * 1024


class SpoolWriter:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        self._files: dict[int, IO[bytes]] = {}

    def path(self, bucket: int) -> Path:
        return bucket_path(self.directory, bucket)

    def add(self, bucket: int, key: bytes, payload: bytes) -> None:
        fh = self._files.get(bucket)
        if fh is None:
            fh = self._files[bucket] = self.path(bucket).open("wb", buffering=WRITE_BUFFER)
        fh.write(_HEADER.pack(len(payload)) + key + payload)

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()


def bucket_path(directory: Path, bucket: int) -> Path:
    return directory / f"bucket-{bucket:05d}.spool"


class SpoolReader:
    """Sequential reader of one bucket's frames."""

    def __init__(self, path: Path) -> None:
        self._fh: IO[bytes] = path.open("rb", buffering=READ_BUFFER)
        self._path = path

    def next(self) -> tuple[bytes, bytes]:
        """(key, payload) of the next record."""
        read = self._fh.read
        head = read(4 + ID_BYTES)
        if len(head) != 4 + ID_BYTES:
            raise EOFError(f"spool {self._path} ended early")
        (size,) = _HEADER.unpack_from(head)
        payload = read(size)
        if len(payload) != size:
            raise EOFError(f"spool {self._path} ended early")
        return head[4:], payload

    def skip(self) -> None:
        head = self._fh.read(4 + ID_BYTES)
        if len(head) != 4 + ID_BYTES:
            raise EOFError(f"spool {self._path} ended early")
        self._fh.seek(_HEADER.unpack_from(head)[0], 1)

    def close(self) -> None:
        self._fh.close()
