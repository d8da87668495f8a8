"""The sink's own settings, resolved once from flags, the shared settings
and the run spec. Pure."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from typing import Any

from schemas import RunSpec
from sink.batcher import BatchLimits
from sink.errors import SinkError
from sink.object_keys import Compression, normalize_prefix
from sink.s3_writer import is_local_endpoint
from tokenmill.kafka import clients, topics
from tokenmill.kafka.groups import GroupProtocol, member_config
from tokenmill.settings import Settings


@dataclass(frozen=True)
class SinkConfig:
    """Parameters of one sink instance (see `tokenmill sink --help`)."""

    run: str
    instance: str
    bucket: str
    prefix: str
    compression: Compression
    limits: BatchLimits = field(default_factory=BatchLimits)
    create_bucket: bool = False
    until_done: bool = False
    metrics_port: int = 0
    group_protocol: GroupProtocol = "consumer"
    # KIP-848: the group's consumer.session.timeout.ms when set (else the
    # broker's default); classic: the client's (default 30 s).
    session_timeout_s: float | None = None
    consume_batch: int = 2000
    fetch_wait_max_ms: int = 50
    poll_timeout_s: float = 0.5
    upload_concurrency: int = 4
    # Records held in memory while a round uploads; beyond it, wait for it.
    max_buffer_bytes: int = 256 * 1024 * 1024
    conditional_writes: bool = True
    done_check_interval_s: float = 2.0
    # The broker's timeout of this sink's transactions (--transaction-timeout):
    # how long a sink that died inside one holds its partitions back.
    transaction_timeout_s: float = clients.TRANSACTION_TIMEOUT_S
    step_timeout_s: float = 30.0  # each transaction step's deadline
    # An idle sink still commits its counters this often: `status` sees it
    # alive, and a duplicate --instance that fenced it is noticed.
    heartbeat_s: float = 10.0
    stall_s: float = 300.0  # longest loop turn without a beat (an upload round can be long)
    # An owned partition silent this long while committed records wait past
    # where the consumer would read: librdkafka stopped fetching it; exit
    # (tokenmill/kafka/fetch_stall.py).
    fetch_stall_s: float = 60.0

    @property
    def transactional_id(self) -> str:
        return topics.transactional_id(self.run, "sink", self.instance)

    @property
    def consumer_settings(self) -> dict[str, Any]:
        """librdkafka settings of the sink's group member (over the shared ones)."""
        return {
            **member_config(self.group_protocol, client_id=f"{self.instance}#0",
                            session_timeout_s=self.session_timeout_s),
            "enable.partition.eof": True,
            # The default 500 ms caps a read_committed backlog at a few
            # thousand 10 KB records/s; 50 ms costs 20 idle fetches/s.
            "fetch.wait.max.ms": self.fetch_wait_max_ms,
            # With 10 KB records the 64 MB prefetch queue fills in ~6,000
            # records; librdkafka then pauses fetching for up to 1 s by default.
            "fetch.queue.backoff.ms": 20,
        }


def default_instance() -> str:
    """Stable across restarts of the same host (the transactional id depends
    on it); run several sinks on one host with distinct `--instance` values."""
    return socket.gethostname().split(".")[0] or "sink"


def resolve(settings: Settings, spec: RunSpec, *, instance: str | None,
            compression: Compression | None, create_bucket: bool | None,
            limits: BatchLimits, **rest: object) -> SinkConfig:
    """Flags and environment win over the run spec's S3 destination.

    `create_bucket` None means: create a missing bucket only on a loopback
    endpoint (the dev stack, tests), never on AWS or a remote endpoint."""
    destination = spec.s3
    bucket = settings.s3_bucket or (destination.bucket if destination else None)
    if not bucket:
        raise SinkError(
            f"no S3 bucket for run {spec.run_id}: the run spec has none; pass --s3-bucket "
            "(or TOKENMILL_S3_BUCKET)")
    prefix = settings.s3_prefix or (destination.prefix if destination else "")
    chosen: Compression = compression or (destination.compression if destination else "none")
    if create_bucket is None:
        create_bucket = is_local_endpoint(settings.s3_endpoint_url)
    return SinkConfig(
        run=spec.run_id,
        instance=instance or default_instance(),
        bucket=bucket,
        prefix=normalize_prefix(prefix),
        compression=chosen,
        limits=limits,
        create_bucket=create_bucket,
        **rest,  # type: ignore[arg-type]
    )


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3}


_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([a-z]*)")


def parse_size(text: str) -> int:
    """'67108864', '64MiB', '64mb', '512k', '1.5g' -> bytes (at least 1)."""
    cleaned = text.strip().lower().replace(" ", "")
    match = _SIZE.fullmatch(cleaned)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use bytes, or a suffix like 64MiB, 512k)")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size < 1:
        raise ValueError(f"not a size: {text!r} (must be at least 1 byte)")
    return size
