"""Kafka (and S3) for benchmarks: the environment's when TOKENMILL_BOOTSTRAP_SERVERS
is set, else a native dev stack on free ports in a temporary directory."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tokenmill.settings import Settings


@contextmanager
def bench_settings(kafka_heap: str = "1g") -> Iterator[Settings]:
    bootstrap = os.environ.get("TOKENMILL_BOOTSTRAP_SERVERS")
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        if bootstrap:
            yield Settings(bootstrap_servers=bootstrap,
                           s3_endpoint_url=os.environ.get("TOKENMILL_S3_ENDPOINT_URL"),
                           s3_bucket=os.environ.get("TOKENMILL_S3_BUCKET"),
                           state_dir=Path(tmp))
            return
        from tokenmill.devstack import s3_server, stack

        state, _ = stack.up(stack.StackPlan.on_free_ports(Path(tmp), kafka_heap=kafka_heap))
        os.environ.setdefault("AWS_ACCESS_KEY_ID", s3_server.DEV_ACCESS_KEY)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", s3_server.DEV_SECRET_KEY)
        try:
            yield Settings(bootstrap_servers=state.bootstrap,
                           s3_endpoint_url=state.s3.address, s3_bucket=state.bucket,
                           state_dir=Path(tmp))
        finally:
            stack.down(Path(tmp))
