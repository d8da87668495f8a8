"""`tokenmill sink`: parses flags, hands off to SinkService."""

from __future__ import annotations

import sys
from typing import Any

import click

from sink.batcher import BatchLimits
from sink.config import parse_size, resolve
from sink.errors import SinkError
from sink.s3_writer import wait_for_bucket
from sink.service import SinkService, tune_gc
from tokenmill.commandline import (
    register_known_error,
    run_service,
    service_command,
    transaction_timeout_option,
)
from tokenmill.flag_types import RUN_ID, seconds
from tokenmill.kafka import clients
from tokenmill.kafka.transactions import KafkaFatal
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

register_known_error(SinkError, KafkaFatal)


class SizeType(click.ParamType):  # type: ignore[type-arg]
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@click.command("sink")
@click.option("--run", "run_id", required=True, type=RUN_ID,
              help="Run id whose completions to persist.")
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="Records per batch (per partition) before it is flushed.")
@click.option("--max-batch-bytes", type=SizeType(), default="64MiB", show_default=True,
              help="Flush a batch once its records reach this many bytes (e.g. 64MiB).")
@click.option("--max-batch-age", "max_batch_age_s", type=seconds(0, 7 * 86400),
              default=600.0, show_default=True,
              help="Flush a batch this many seconds after its first record.")
@click.option("--compression", type=click.Choice(["none", "zstd"]), default=None,
              help="Object compression [default: the run spec's s3.compression, else none].")
@click.option("--instance", default=None,
              help="Stable instance id: the transactional id and the group member's client "
                   "id [default: the host name]. Unique per sink process.")
@click.option("--until-done", is_flag=True,
              help="Exit 0 once every prompt of the run is persisted (S3 or DLQ).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535), default=0,
              show_default=True, help="Serve Prometheus /metrics on this port (0: off).")
@click.option("--create-bucket/--no-create-bucket", default=None,
              help="Create a missing bucket [default: only on a loopback endpoint].")
@click.option("--group-protocol", type=click.Choice(["consumer", "classic"]), default="consumer",
              show_default=True,
              help="consumer: KIP-848 (Kafka 4.0+); classic: the older protocol.")
@click.option("--session-timeout", "session_timeout_s", type=seconds(1, 1800, min_open=False),
              default=None,
              help="Seconds a crashed sink keeps its partitions before the others take them "
                   "over. KIP-848: the group's consumer.session.timeout.ms (default: the "
                   "broker's); classic: the client's (default 30).")
@transaction_timeout_option("sink", clients.TRANSACTION_TIMEOUT_S)
@click.option("--upload-concurrency", type=click.IntRange(min=1, max=64), default=4,
              show_default=True, help="Partitions whose batches upload in parallel.")
@click.option("--conditional-writes/--no-conditional-writes", default=True, show_default=True,
              help="Send If-None-Match/If-Match on uploads, after checking at start that the "
                   "store honours them (a store that does not is refused). Off: neither; a "
                   "sink that lost its partitions mid-upload can then overwrite a newer object.")
@click.option("--heartbeat-interval", "heartbeat_s", default=10.0, show_default=True,
              type=seconds(0.5, 600, min_open=False),
              help="Seconds between commits of an idle sink: `status` marks a sink whose last "
                   "commit is older than twice this as dead.")
@click.option("--fetch-stall", "fetch_stall_s", default=60.0, show_default=True,
              type=seconds(1, 3600, min_open=False),
              help="Seconds an owned partition may stay silent while committed records wait "
                   "for it before the sink exits so that its supervisor restarts it (a Kafka "
                   "client that stopped fetching after a broker restart).")
@service_command
def sink(*, settings: Settings, run_id: str, batch_size: int, max_batch_bytes: int,
         max_batch_age_s: float, compression: str | None, instance: str | None,
         until_done: bool, metrics_port: int, create_bucket: bool | None,
         group_protocol: str, session_timeout_s: float | None,
         transaction_timeout_s: float, upload_concurrency: int,
         conditional_writes: bool, heartbeat_s: float, fetch_stall_s: float) -> None:
    """Persist a run's completions: good samples to S3 as JSONL batches, the
    rest to the run's dead-letter topic, exactly once.

    At start it waits for Kafka and S3 (up to --startup-timeout-s)."""
    clients.wait_for_broker(settings)
    spec = RunRegistry(settings).get(run_id)
    config = resolve(
        settings, spec, instance=instance, compression=compression,  # type: ignore[arg-type]
        create_bucket=create_bucket,
        limits=BatchLimits(max_records=batch_size, max_bytes=max_batch_bytes,
                           max_age_s=max_batch_age_s),
        until_done=until_done, metrics_port=metrics_port, group_protocol=group_protocol,
        session_timeout_s=session_timeout_s, transaction_timeout_s=transaction_timeout_s,
        upload_concurrency=upload_concurrency, conditional_writes=conditional_writes,
        heartbeat_s=heartbeat_s, fetch_stall_s=fetch_stall_s)
    wait_for_bucket(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                    bucket=config.bucket, create=config.create_bucket,
                    timeout_s=settings.startup_timeout_s,
                    connect_timeout_s=settings.connect_timeout_s)
    service = SinkService(settings=settings, spec=spec, config=config)
    service.install_signal_handlers()
    tune_gc()
    sys.exit(run_service(service.run))
