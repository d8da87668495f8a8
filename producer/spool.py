"""Local spool files between the two passes: one file per bucket, records in
the order pass 1 accepted them.

One line per record: the 32-byte prompt id (the Kafka key), the payload (the
encoded record up to its `seq`, see records.py), a newline. The payload is
msgspec JSON, which never holds a raw newline (strings escape it), so one
`readline` reads one record. Pass 2 reads each bucket sequentially, so memory
stays flat whatever the dataset size. The spool is rebuilt from the inputs on every run: it is a
cache of pass 1, never a source of truth.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO

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
        self.writer(bucket)(b"%b%b\n" % (key, payload))

    def writer(self, bucket: int) -> Callable[[bytes], int]:
        """The `write` of a bucket's file, for callers that write whole lines
        (id + payload + newline) in a hot loop."""
        fh = self._files.get(bucket)
        if fh is None:
            fh = self._files[bucket] = self.path(bucket).open("wb", buffering=WRITE_BUFFER)
        return fh.write

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()


def bucket_path(directory: Path, bucket: int) -> Path:
    return directory / f"bucket-{bucket:05d}.spool"


class SpoolReader:
    """Sequential reader of one bucket's records."""

    def __init__(self, path: Path) -> None:
        self._fh: IO[bytes] = path.open("rb", buffering=READ_BUFFER)
        self._path = path
        self.readline = self._fh.readline  # a record: id (32 bytes), payload, b"\n"

    def next(self) -> bytes:
        line = self.readline()
        if not line.endswith(b"\n"):
            raise EOFError(f"spool {self._path} ended early")
        return line

    def skip(self) -> None:
        self.next()

    def close(self) -> None:
        self._fh.close()
