"""S3 I/O for the sink: probe (HEAD), conditional upload, delete, bucket check.

Works against AWS S3 and any S3-compatible endpoint (`endpoint_url`, path
style addressing). Every request is retried by botocore's standard retry
mode (throttling, 5xx, connection errors) with exponential backoff. Objects
above `multipart_threshold` go up as an explicit multipart upload (parts in
parallel), since s3transfer cannot pass the conditional headers.

`wait_for_bucket` is the sink's start-up wait: an endpoint that does not
answer yet is retried (logged) up to the start-up timeout.

Writes are conditional: a write that creates a key sends `If-None-Match: *`,
a write that replaces a probed object sends `If-Match: <its etag>`; a
failed condition raises `ObjectConflict` (another owner wrote the key).
Endpoints that ignore these headers overwrite instead; see sink/batcher.py
for what pinning still guarantees then. The sink's start-up check
(sink/store_check.py) finds what the endpoint honours and `adapt`s the
writer: the ETag form `If-Match` takes, and whether conditions hold on
CompleteMultipartUpload (else objects go up in one PUT, up to 5 GiB).
"""

from __future__ import annotations

import ipaddress
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from sink import objects
from sink.batcher import ExistingObject
from sink.errors import BucketMissing, ObjectConflict, S3Failed, S3Unreachable
from tokenmill.log import get_logger
from tokenmill.startup import StartupWait, wait_until_up

log = get_logger("tokenmill.sink.s3")

MiB = 1024 * 1024
CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError,
                ConnectionClosedError)


@dataclass(frozen=True)
class Uploaded:
    key: str
    etag: str
    size: int
    parts: int


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_local_endpoint(endpoint_url: str | None) -> bool:
    """True for loopback endpoints (the dev stack, tests): the only place a
    missing bucket is created without `--create-bucket`."""
    if not endpoint_url:
        return False
    host = urlparse(endpoint_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_client(*, endpoint_url: str | None, region: str, max_attempts: int = 10,
                max_pool: int = 16, connect_timeout_s: float = 10.0,
                read_timeout_s: float = 120.0) -> Any:
    """A boto3 S3 client with standard retries (exponential backoff).

    Payloads are not SHA-256 signed on HTTPS (botocore's default there: the
    CRC32 checksum header covers integrity) nor on a loopback endpoint, where
    signing would be most of the upload's CPU; a plain-HTTP remote endpoint
    keeps botocore's payload signing."""
    s3_options: dict[str, Any] = {}
    if endpoint_url:
        s3_options["addressing_style"] = "path"
        if is_local_endpoint(endpoint_url):
            s3_options["payload_signing_enabled"] = False
    config = Config(
        region_name=region,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        connect_timeout=connect_timeout_s,
        read_timeout=read_timeout_s,
        max_pool_connections=max_pool,
        s3=s3_options or None,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


class S3Writer:
    """Parameters: `client` (a boto3 S3 client), `bucket`,
    `multipart_threshold` and `part_size` in bytes, `part_concurrency`,
    `conditional_writes` (send If-None-Match / If-Match)."""

    def __init__(self, *, client: Any, bucket: str, multipart_threshold: int = 64 * MiB,
                 part_size: int = 16 * MiB, part_concurrency: int = 4,
                 conditional_writes: bool = True) -> None:
        if part_size < 5 * MiB:
            raise ValueError("S3 parts must be at least 5 MiB")
        self.client = client
        self.bucket = bucket
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.part_concurrency = part_concurrency
        self.conditional_writes = conditional_writes
        self.etag_unquoted = False  # If-Match takes the ETag without its quotes
        self.multipart_conditions = True  # conditions hold on CompleteMultipartUpload

    def adapt(self, profile: Any) -> None:
        """Send conditions the way the store honours them (a StoreProfile)."""
        self.etag_unquoted = profile.etag_unquoted
        self.multipart_conditions = profile.multipart_conditions

    # -- bucket --------------------------------------------------------------

    def ensure_bucket(self, *, create: bool, region: str) -> bool:
        """Check the bucket; create it if missing and allowed. True if created.
        S3Unreachable when the endpoint does not answer."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except _UNREACHABLE as exc:
            raise S3Unreachable(f"no answer ({exc})") from None
        except NoCredentialsError:
            raise S3Failed("no S3 credentials found: set AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE") from None
        except BotoCoreError as exc:
            raise S3Failed(f"cannot use s3 bucket {self.bucket!r}: {exc}") from None
        except ClientError as exc:
            if _status(exc) >= 500:
                raise S3Unreachable(f"HEAD bucket answered {_status(exc)} ({_code(exc)})") from None
            if _code(exc) not in MISSING_CODES and _status(exc) != 404:
                raise S3Failed(f"cannot use s3 bucket {self.bucket!r}: {exc}") from None
        if not create:
            raise BucketMissing(
                f"s3 bucket {self.bucket!r} does not exist; create it, or pass --create-bucket")
        self._create_bucket(region)
        log.info("bucket created", bucket=self.bucket)
        return True

    def _create_bucket(self, region: str) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self.client.create_bucket(**kwargs)
        except _UNREACHABLE as exc:
            raise S3Unreachable(f"no answer ({exc})") from None
        except ClientError as exc:
            if _code(exc) in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                pass
            elif _status(exc) >= 500:  # 503 SlowDown, 500: the start-up wait tries again
                raise S3Unreachable(
                    f"CREATE bucket answered {_status(exc)} ({_code(exc)})") from None
            else:
                raise S3Failed(f"cannot create s3 bucket {self.bucket!r}: {exc}") from None

    # -- probe ---------------------------------------------------------------

    def probe(self, keys: list[str]) -> tuple[ExistingObject, ...]:
        """HEAD each key; the objects that exist, with their record ranges."""
        found = []
        for key in keys:
            try:
                head = self.client.head_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in MISSING_CODES or _status(exc) == 404:
                    continue
                raise
            found.append(objects.existing(key, head["ETag"], int(head["ContentLength"]),
                                          head.get("Metadata", {})))
        return tuple(found)

    # -- write ---------------------------------------------------------------

    def _conditions(self, if_match: str | None) -> dict[str, str]:
        if not self.conditional_writes:
            return {}
        if if_match:
            return {"IfMatch": if_match.strip('"') if self.etag_unquoted else if_match}
        return {"IfNoneMatch": "*"}

    def upload(self, key: str, data: bytes, metadata: dict[str, str], *,
               content_type: str, content_encoding: str | None = None,
               if_match: str | None = None) -> Uploaded:
        """Write one object: create it (`if_match` None) or replace the probed
        object with that etag. Raises ObjectConflict if the condition fails."""
        extra: dict[str, Any] = {"Metadata": metadata, "ContentType": content_type}
        if content_encoding:
            extra["ContentEncoding"] = content_encoding
        try:
            if len(data) <= self.multipart_threshold or (
                    self.conditional_writes and not self.multipart_conditions):
                response = self.client.put_object(
                    Bucket=self.bucket, Key=key, Body=data, **extra, **self._conditions(if_match))
                return Uploaded(key, response["ETag"], len(data), 1)
            return self._multipart(key, data, extra, if_match)
        except ClientError as exc:
            if _code(exc) in CONFLICT_CODES or _status(exc) in (409, 412) or (
                    if_match and (_code(exc) in MISSING_CODES or _status(exc) == 404)):
                raise ObjectConflict(key) from None
            raise

    def _multipart(self, key: str, data: bytes, extra: dict[str, Any],
                   if_match: str | None) -> Uploaded:
        upload_id = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, **extra)["UploadId"]
        view = memoryview(data)
        chunks = [view[i:i + self.part_size] for i in range(0, len(data), self.part_size)]

        def put_part(number: int) -> dict[str, Any]:
            response = self.client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number,
                Body=bytes(chunks[number - 1]))
            return {"PartNumber": number, "ETag": response["ETag"]}

        try:
            with ThreadPoolExecutor(max_workers=self.part_concurrency) as pool:
                parts = list(pool.map(put_part, range(1, len(chunks) + 1)))
            response = self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": parts}, **self._conditions(if_match))
        except BaseException:
            try:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key,
                                                   UploadId=upload_id)
            except ClientError as exc:  # the upload is abandoned either way
                log.warning("abort multipart upload failed", key=key, error=str(exc))
            raise
        return Uploaded(key, response["ETag"], len(data), len(parts))

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)


def wait_for_bucket(*, endpoint_url: str | None, region: str, bucket: str, create: bool,
                    timeout_s: float, connect_timeout_s: float) -> None:
    """Wait (logged, bounded) until the endpoint answers, then check the bucket
    and create it if missing and allowed. Each try is one request, without
    botocore's own retries, so the log says what happens when it happens."""
    probe = S3Writer(client=make_client(endpoint_url=endpoint_url, region=region,
                                        max_attempts=1, max_pool=1,
                                        connect_timeout_s=connect_timeout_s),
                     bucket=bucket)
    wait = StartupWait("S3", f"{endpoint_url or 'AWS S3'} (bucket {bucket})", timeout_s=timeout_s,
                       hint="is the S3 endpoint up? (--s3-endpoint-url / "
                            "TOKENMILL_S3_ENDPOINT_URL)")
    wait_until_up(lambda: probe.ensure_bucket(create=create, region=region), wait,
                  down=(S3Unreachable,))
