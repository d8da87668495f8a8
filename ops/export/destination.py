"""Where an export's files go: a local directory or `s3://bucket/prefix`.

A shard is written to a staging file first (beside its final name locally,
in a temporary directory for S3) and appears under its name only when
complete: a rename locally, one upload to S3. A killed export leaves at most
a staging file, never a half-written shard.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import ClientError

from sink.s3_writer import MISSING_CODES, make_client
from tokenmill.settings import Settings


class BadDestination(ValueError):
    """`--out` is neither a directory nor s3://bucket/prefix."""


class Destination(Protocol):
    where: str

    def staging(self, name: str) -> Path: ...

    def commit(self, name: str, staged: Path) -> None: ...

    def size(self, name: str) -> int | None: ...

    def read(self, name: str) -> bytes | None: ...

    def write(self, name: str, data: bytes) -> None: ...

    def delete(self, name: str) -> None: ...

    def close(self) -> None: ...


class LocalDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        path.mkdir(parents=True, exist_ok=True)

    def staging(self, name: str) -> Path:
        return self.path / f".{name}.part"

    def commit(self, name: str, staged: Path) -> None:
        os.replace(staged, self.path / name)

    def size(self, name: str) -> int | None:
        target = self.path / name
        return target.stat().st_size if target.is_file() else None

    def read(self, name: str) -> bytes | None:
        target = self.path / name
        return target.read_bytes() if target.is_file() else None

    def write(self, name: str, data: bytes) -> None:
        staged = self.staging(name)
        staged.write_bytes(data)
        self.commit(name, staged)

    def delete(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def close(self) -> None:
        pass


class S3Prefix:
    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.where = f"s3://{bucket}/{self.prefix}"
        self._tmp = Path(tempfile.mkdtemp(prefix="tokenmill-export-"))

    def _key(self, name: str) -> str:
        return self.prefix + name

    def staging(self, name: str) -> Path:
        return self._tmp / name

    def commit(self, name: str, staged: Path) -> None:
        self.client.upload_file(str(staged), self.bucket, self._key(name))
        staged.unlink()

    def size(self, name: str) -> int | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in MISSING_CODES:
                return None
            raise
        return int(head["ContentLength"])

    def read(self, name: str) -> bytes | None:
        try:
            return bytes(self.client.get_object(Bucket=self.bucket,
                                                Key=self._key(name))["Body"].read())
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in MISSING_CODES:
                return None
            raise

    def write(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def open_destination(out: str, settings: Settings) -> Destination:
    """`s3://bucket/prefix` (the shared S3 endpoint settings), else a directory."""
    if out.startswith("s3://"):
        bucket, _, prefix = out[len("s3://"):].partition("/")
        if not bucket:
            raise BadDestination(f"--out {out!r}: expected s3://bucket/prefix")
        client = make_client(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region)
        return S3Prefix(client, bucket, prefix)
    if Path(out).exists() and not Path(out).is_dir():
        raise BadDestination(f"--out {out!r} is a file; give a directory or s3://bucket/prefix")
    return LocalDirectory(Path(out))
