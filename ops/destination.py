"""Where a committed completion record went: an S3 object or the dead-letter
topic, for `tokenmill spot-check`.

The route is the sink's own pure classifier (`sink.routing.dlq_reason`), so
spot-check says what the sink does. The S3 object is found best effort: list
the partition's keys (ordered by first offset, see sink/object_keys.py), take
the last one starting at or before the record's offset and read its
`last-offset` metadata. Every request has short timeouts and at most one
retry, and after S3 fails to answer once no more requests are made, so a
missing or unreachable S3 costs one timeout, never a hang or a crash.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from schemas import CompletionRecord, RunSpec
from sink.batcher import BatchLimits
from sink.config import resolve
from sink.errors import SinkError
from sink.object_keys import parse_key, partition_dir
from sink.routing import dlq_reason
from sink.s3_writer import make_client
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.ops.destination")

CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 5.0
MAX_ATTEMPTS = 2  # one retry
MAX_PAGES = 10  # 10,000 keys of one partition listed at most per record


class Route(msgspec.Struct, frozen=True):
    """`target` "s3" or "dlq"; a dead letter's `reason` and `detail` as the
    sink writes them."""

    target: Literal["s3", "dlq"]
    reason: str | None = None
    detail: str | None = None


def route(record: CompletionRecord, spec: RunSpec) -> Route:
    found = dlq_reason(record, spec)
    if found is None:
        return Route("s3")
    return Route("dlq", *found)


def choose_key(keys: Iterable[str], partition: int, offset: int) -> str | None:
    """The key of the partition's object with the largest first offset at or
    before `offset` (the only object that can hold the record), or None.
    Keys of other partitions and foreign keys are ignored; of two keys with
    the same first offset (either compression) the greater one is taken."""
    best: tuple[int, str] | None = None
    for key in keys:
        try:
            parsed = parse_key(key)
        except ValueError:
            continue
        if parsed.partition != partition or parsed.first_offset > offset:
            continue
        candidate = (parsed.first_offset, key)
        if best is None or candidate > best:
            best = candidate
    return best[1] if best else None


def holds(metadata: Mapping[str, str], offset: int) -> bool | None:
    """Whether an object's record range (sink metadata) reaches `offset`;
    None when the metadata does not say."""
    try:
        return int(metadata["first-offset"]) <= offset <= int(metadata["last-offset"])
    except (KeyError, ValueError):
        return None


def describe_error(exc: BaseException, bucket: str) -> str:
    """A few words on why S3 could not tell."""
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError)):
        return "S3 unreachable"
    if isinstance(exc, NoCredentialsError):
        return "no S3 credentials"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket":
            return f"no bucket {bucket}"
        if code in ("AccessDenied", "403"):
            return f"access to bucket {bucket} denied"
        return f"S3 answered {code or 'an error'}"
    if isinstance(exc, BotoCoreError):
        return type(exc).__name__
    return str(exc)[:80] or type(exc).__name__


def s3_label(key: str | None, held: bool | None) -> str:
    """What the operator reads for a record routed to S3."""
    if key is None or held is False:
        return "S3 (not yet persisted)"
    if held is None:
        return f"S3 ({key}?: the object has no record range)"
    return f"S3: {key}"


class KeyFinder:
    """The thin I/O around `choose_key`: one bounded listing and one HEAD per
    record, nothing at all once S3 failed to answer."""

    def __init__(self, client: Any, bucket: str, prefix: str, run: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.run = run
        self.broken: str | None = None

    @classmethod
    def for_run(cls, settings: Settings, spec: RunSpec) -> KeyFinder | str:
        """A finder for the run's bucket and prefix (as the sink resolves
        them), or why there is none."""
        try:
            config = resolve(settings, spec, instance="spot-check", compression=None,
                             create_bucket=False, limits=BatchLimits())
        except SinkError:
            return "no S3 bucket configured"
        client = make_client(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                             max_attempts=MAX_ATTEMPTS, max_pool=1,
                             connect_timeout_s=CONNECT_TIMEOUT_S, read_timeout_s=READ_TIMEOUT_S)
        return cls(client, config.bucket, config.prefix, spec.run_id)

    def _keys_up_to(self, partition: int, offset: int) -> list[str]:
        """The partition's keys in order, up to the first one past `offset`."""
        keys: list[str] = []
        request: dict[str, Any] = {"Bucket": self.bucket,
                                   "Prefix": partition_dir(self.prefix, self.run, partition)}
        for _ in range(MAX_PAGES):
            page = self.client.list_objects_v2(**request)
            for item in page.get("Contents", []):
                keys.append(item["Key"])
                try:
                    if parse_key(item["Key"]).first_offset > offset:
                        return keys
                except ValueError:
                    continue
            if not page.get("IsTruncated"):
                return keys
            request["ContinuationToken"] = page["NextContinuationToken"]
        raise LookupError(f"more than {MAX_PAGES * 1000} objects in partition {partition}")

    def label(self, partition: int, offset: int) -> str:
        if self.broken:
            return f"S3 (key unknown: {self.broken})"
        try:
            key = choose_key(self._keys_up_to(partition, offset), partition, offset)
            held = None
            if key is not None:
                head = self.client.head_object(Bucket=self.bucket, Key=key)
                held = holds(head.get("Metadata", {}), offset)
        except LookupError as exc:
            return f"S3 (key unknown: {exc})"
        except (BotoCoreError, ClientError) as exc:  # best effort: a reason shown, not a crash
            self.broken = describe_error(exc, self.bucket)
            log.info("s3 key lookup stopped", reason=self.broken, error=str(exc))
            return f"S3 (key unknown: {self.broken})"
        return s3_label(key, held)
