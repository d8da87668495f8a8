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

# Objects read ahead: a few, and no more bytes than this (one sink batch can
# be up to 64 MiB), so memory stays bounded whatever the batch size.
PREFETCH = 6
PREFETCH_BYTES = 48 * 1024 * 1024


def object_keys(client: Any, bucket: str, prefix: str, run: str) -> list[tuple[str, int]]:
    """(key, size) of the run's sink objects, sorted by key; anything else
    under the prefix is not the sink's and is left out."""
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            key = item["Key"]
            try:
                if parse_key(key).run == run:
                    keys.append((key, int(item.get("Size", 0))))
            except ValueError:
                continue
    return sorted(keys)


def _body(client: Any, bucket: str, key: str) -> bytes:
    data = bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    if key.endswith(".zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def lines(client: Any, bucket: str, keys: list[tuple[str, int]], prefetch: int = PREFETCH,
          prefetch_bytes: int = PREFETCH_BYTES) -> Iterator[bytes]:
    """Every line of the objects, in order (newline not included)."""
    with ThreadPoolExecutor(max_workers=prefetch, thread_name_prefix="export-get") as pool:
        pending: deque[tuple[Future[bytes], int]] = deque()
        queued = deque(keys)
        in_flight = 0
        while queued or pending:
            while queued and (not pending or (len(pending) < prefetch and
                                              in_flight + queued[0][1] <= prefetch_bytes)):
                key, size = queued.popleft()
                pending.append((pool.submit(_body, client, bucket, key), size))
                in_flight += size
            future, size = pending.popleft()
            data = future.result()
            in_flight -= size
            for line in data.split(b"\n"):
                if line:
                    yield line
