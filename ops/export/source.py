"""A run's accepted results as they lie in S3: its sink's objects under
`{prefix}{run}/`, in key order (partition, then first offset: the keys are
zero-padded), read a few objects ahead in threads while the caller works
through the lines of the current one."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import zstandard

from sink.object_keys import parse_key

PREFETCH = 4  # objects in flight; an object is one sink batch (500 records by default)


def object_keys(client: Any, bucket: str, prefix: str, run: str) -> list[str]:
    """Keys of the run's sink objects, sorted; anything else under the prefix
    is not the sink's and is left out."""
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            try:
                if parse_key(key).run == run:
                    keys.append(key)
            except ValueError:
                continue
    return sorted(keys)


def _body(client: Any, bucket: str, key: str) -> bytes:
    data = bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    if key.endswith(".zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def lines(client: Any, bucket: str, keys: list[str],
          prefetch: int = PREFETCH) -> Iterator[bytes]:
    """Every line of the objects, in order (newline not included)."""
    with ThreadPoolExecutor(max_workers=prefetch, thread_name_prefix="export-get") as pool:
        pending: deque[Future[bytes]] = deque()
        queued = iter(keys)
        for key in queued:
            pending.append(pool.submit(_body, client, bucket, key))
            if len(pending) >= prefetch:
                break
        while pending:
            data = pending.popleft().result()
            nxt = next(queued, None)
            if nxt is not None:
                pending.append(pool.submit(_body, client, bucket, nxt))
            for line in data.split(b"\n"):
                if line:
                    yield line
