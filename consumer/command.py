"""`tokenmill consume`: the generation worker for one GPU."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from urllib.parse import urlparse

import click

from consumer.backoff import RetryPolicy
from consumer.worker import FatalWorkerError, Worker, WorkerConfig
from tokenmill.commandline import register_known_error, service_command
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

register_known_error(FatalWorkerError)


def default_instance(sglang_url: str) -> str:
    """Stable across restarts on the same host and server, unique per GPU."""
    port = urlparse(sglang_url).port or 80
    return f"{socket.gethostname()}-{port}"


def _concurrency(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        number = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a positive number or 'auto', got {value!r}") from None
    if number < 1:
        raise click.BadParameter(f"expected a positive number or 'auto', got {value!r}")
    return number


@click.command()
@click.option("--run", "run_id", required=True, help="Run id.")
@click.option("--sglang-url", required=True, envvar="TOKENMILL_SGLANG_URL",
              help="Base URL of the OpenAI-compatible server. [env: TOKENMILL_SGLANG_URL]")
@click.option("--instance", default=None, envvar="TOKENMILL_INSTANCE",
              help="Stable unique id of this worker (transactional.id and group.instance.id). "
                   "Default: <hostname>-<server port>. [env: TOKENMILL_INSTANCE]")
@click.option("--concurrency", default="auto", show_default=True,
              help="In-flight request limit, or 'auto' to follow SGLang's /metrics.")
@click.option("--max-concurrency", default=1024, show_default=True, type=int,
              help="Hard cap on in-flight requests (also caps 'auto').")
@click.option("--commit-interval", "commit_interval_s", default=2.0, show_default=True,
              type=click.FloatRange(0.05, 5.0), help="Seconds between transactions.")
@click.option("--max-attempts", default=5, show_default=True, type=click.IntRange(1, 100),
              help="Attempts per prompt for 5xx, timeouts and aborts.")
@click.option("--retry-base", "retry_base_s", default=1.0, show_default=True, type=float,
              help="First retry delay in seconds (doubles, with jitter).")
@click.option("--request-timeout", "request_timeout_s", default=1800.0, show_default=True,
              type=float, help="Seconds before a request counts as timed out.")
@click.option("--drain-timeout", "drain_timeout_s", default=60.0, show_default=True, type=float,
              help="On SIGTERM, seconds to let in-flight requests finish.")
@click.option("--session-timeout-ms", default=30_000, show_default=True, type=int,
              help="Kafka session timeout: how long a crashed worker keeps its partitions.")
@click.option("--static-membership/--no-static-membership", default=True, show_default=True,
              help="group.instance.id = instance: a restart takes its partitions back "
                   "without a group-wide rebalance.")
@click.option("--until-done", is_flag=True,
              help="Exit 0 once the producer has finished and every prompt has a committed result.")
@click.option("--metrics-port", default=0, type=int, help="Serve Prometheus /metrics here (0: off).")
@service_command
def consume(settings: Settings, run_id: str, sglang_url: str, instance: str | None,
            concurrency: str, max_concurrency: int, commit_interval_s: float, max_attempts: int,
            retry_base_s: float, request_timeout_s: float, drain_timeout_s: float,
            session_timeout_ms: int, static_membership: bool, until_done: bool,
            metrics_port: int) -> None:
    """Generate completions for a run's prompts, exactly once, next to one SGLang server.

    \b
    Example:
      tokenmill consume --run my-run --sglang-url http://127.0.0.1:30000 --instance gpu0
    """
    spec = RunRegistry(settings).get(run_id)
    config = WorkerConfig(
        instance=instance or default_instance(sglang_url),
        sglang_url=sglang_url,
        concurrency=_concurrency(concurrency),
        max_concurrency=max_concurrency,
        commit_interval_s=commit_interval_s,
        retry=RetryPolicy(max_attempts=max_attempts, base_s=retry_base_s),
        request_timeout_s=request_timeout_s,
        drain_timeout_s=drain_timeout_s,
        session_timeout_ms=session_timeout_ms,
        static_membership=static_membership,
        until_done=until_done,
        metrics_port=metrics_port,
        api_key=os.environ.get("TOKENMILL_SGLANG_API_KEY") or None,
    )
    code = asyncio.run(Worker(settings, spec, config).run())
    sys.exit(code)
