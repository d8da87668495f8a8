"""Kafka and S3 for benchmarks, configured the way every tokenmill command
is: from the `TOKENMILL_*` variables the README documents
(TOKENMILL_BOOTSTRAP_SERVERS, TOKENMILL_S3_ENDPOINT_URL, TOKENMILL_S3_BUCKET,
the SASL/TLS ones; S3 credentials from boto3's usual chain). Without
TOKENMILL_BOOTSTRAP_SERVERS, a private dev stack on free ports in a
temporary directory (the broker configured from deploy/kafka/server.properties,
KIP-848 groups included), stopped afterwards."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from tokenmill.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent


def _pin(pid: int, cores: set[int]) -> None:
    try:
        os.sched_setaffinity(pid, cores)
    except (AttributeError, OSError):
        pass


@contextmanager
def bench_settings(kafka_heap: str = "1g", services_cores: set[int] | None = None,
                   brokers: int = 1) -> Iterator[Settings]:
    """Settings for the services; `services_cores` pins a private stack's
    broker and S3 server (so they stay off the core a benchmark measures on);
    `brokers`: a private stack's Kafka nodes (its state: `stack_state`)."""
    with tempfile.TemporaryDirectory(prefix="tokenmill-bench-") as tmp:
        if os.environ.get("TOKENMILL_BOOTSTRAP_SERVERS"):
            settings = load_settings()
            yield msgspec.structs.replace(settings, state_dir=Path(tmp))
            return
        from devstack import s3_server, stack

        state, _ = stack.up(stack.StackPlan.on_free_ports(Path(tmp) / "stack",
                                                         brokers=brokers,
                                                         kafka_heap=kafka_heap))
        os.environ.setdefault("AWS_ACCESS_KEY_ID", s3_server.DEV_ACCESS_KEY)
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", s3_server.DEV_SECRET_KEY)
        if services_cores:
            _pin(state.brokers[0].pid, services_cores)
            _pin(state.s3.pid, services_cores)
        try:
            yield Settings(bootstrap_servers=state.bootstrap,
                           s3_endpoint_url=state.s3.address, s3_bucket=state.bucket,
                           state_dir=Path(tmp))
        finally:
            stack.down(Path(tmp) / "stack")


def stack_dir(settings: Settings) -> Path:
    """Where `bench_settings` keeps a private stack (its `stack.json`, broker data)."""
    return Path(settings.state_dir) / "stack"


def child_env(settings: Settings) -> dict[str, str]:
    """The environment for a `tokenmill` child process: this checkout's code,
    and the services above as the variables it reads."""
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               TOKENMILL_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
               TOKENMILL_STATE_DIR=str(settings.state_dir), TOKENMILL_LOG_FORMAT="json")
    if settings.s3_endpoint_url:
        env["TOKENMILL_S3_ENDPOINT_URL"] = settings.s3_endpoint_url
    if settings.s3_bucket:
        env["TOKENMILL_S3_BUCKET"] = settings.s3_bucket
    return env


def tokenmill_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", *args]
