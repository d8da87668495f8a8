"""The sink's exceptions, under one root."""

from __future__ import annotations


class SinkError(RuntimeError):
    """Root of every error the sink raises on purpose."""


class InvalidRecord(SinkError):
    """A record in `.completions` that cannot belong to this run: a null value,
    undecodable, of another run, or made with other generation settings. It
    goes to the dead-letter topic with reason `invalid`, bytes as read."""


class ObjectConflict(SinkError):
    """A conditional S3 write found the key in another state than expected:
    another writer (a zombie owner of the partition) got there first."""

    def __init__(self, key: str) -> None:
        super().__init__(f"s3 object {key} changed under a conditional write")
        self.key = key


class BucketMissing(SinkError):
    """The destination bucket does not exist and may not be created."""


class S3Failed(SinkError):
    """An S3 request failed after botocore's retries. Nothing of the batch is
    committed; the restarted sink replays it (same key, pinned)."""


class S3Unreachable(S3Failed):
    """The S3 endpoint does not answer (connection refused or timed out, or a
    5xx): at start-up the sink waits for it (tokenmill/startup.py)."""

