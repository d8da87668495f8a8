"""Rejected records: what a reject is, and the JSONL file they all go to.

Bad input is never dropped silently: each rejected record gets one line with
the file, the line (or array index, or Parquet row), a short reason code (for
the summary) and a detail, plus the start of the record for a quick look.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

import msgspec

EXCERPT_BYTES = 200


class Reject(Exception):
    """One record cannot become a prompt; `reason` is a short stable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RejectLine(msgspec.Struct, omit_defaults=True):
    file: str
    line: int
    reason: str
    detail: str
    excerpt: str = ""


def excerpt(data: bytes | dict[str, Any] | object) -> str:
    """The record's first bytes as text (invalid UTF-8 shown as U+FFFD)."""
    if isinstance(data, bytes):
        return data[:EXCERPT_BYTES].decode("utf-8", "replace").rstrip("\n")
    if isinstance(data, dict):
        try:
            return msgspec.json.encode(data)[:EXCERPT_BYTES].decode("utf-8", "replace")
        except (TypeError, msgspec.EncodeError):
            return repr(data)[:EXCERPT_BYTES]
    return ""


class RejectsFile:
    """Appends reject lines; the file is created (truncated) on first use, so
    every run of the producer writes a complete, fresh list."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = 0
        self._fh: IO[bytes] | None = None
        self._encoder = msgspec.json.Encoder()

    def write(self, file: str, line: int, reason: str, detail: str, sample: str = "") -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("wb")
        self._fh.write(self._encoder.encode(RejectLine(file, line, reason, detail, sample)) + b"\n")
        self.count += 1

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def clear(self) -> None:
        """Remove a stale file from an earlier run when this one has no rejects."""
        if self._fh is None and self.path.exists():
            self.path.unlink()
