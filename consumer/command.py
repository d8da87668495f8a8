"""`tokenmill consume`: the generation worker for one GPU."""

from __future__ import annotations

import asyncio
import re
import socket
from urllib.parse import urlparse

import click

from consumer.backoff import RetryPolicy
from consumer.health import wait_for_server
from consumer.worker import FatalWorkerError, Worker, WorkerConfig
from tokenmill.commandline import (
    finish_now,
    register_known_error,
    run_service,
    service_command,
    transaction_timeout_option,
)
from tokenmill.flag_types import PORT_OR_OFF, RUN_ID, seconds
from tokenmill.kafka import clients
from tokenmill.kafka.transactions import KafkaFatal
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings, http_url_problem, sglang_api_key
from tokenmill.startup import StartupLaps, process_age_s
from tokenmill.tool_results import HookUnavailable

register_known_error(FatalWorkerError, KafkaFatal, HookUnavailable)

# The worker's group members are "<instance>#<n>" (consumer/fleet.py).
INSTANCE_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def default_instance(sglang_url: str) -> str:
    """Stable across restarts on the same host and server, unique per GPU."""
    port = urlparse(sglang_url).port or 80
    return f"{socket.gethostname()}-{port}"


def check_url(url: str) -> None:
    """An http(s) URL with a host, or a usage error naming the flag."""
    problem = http_url_problem(url)
    if problem:
        raise click.BadParameter(f"{url!r}: {problem}", param_hint="--sglang-url")


def _concurrency(_ctx: click.Context, _param: click.Parameter, value: str) -> int | None:
    """'auto' -> None (follow /metrics), else a positive number; checked while parsing."""
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
@click.option("--run", "run_id", required=True, type=RUN_ID, help="Run id.")
@click.option("--sglang-url", required=True, envvar="TOKENMILL_SGLANG_URL",
              help="Base URL of the OpenAI-compatible server. [env: TOKENMILL_SGLANG_URL]")
@click.option("--instance", default=None, envvar="TOKENMILL_INSTANCE",
              help="Stable unique id of this worker (its transactional.id, and its group "
                   "members' client ids). "
                   "Default: <hostname>-<server port>. [env: TOKENMILL_INSTANCE]")
@click.option("--concurrency", default="auto", show_default=True, callback=_concurrency,
              help="In-flight request limit, or 'auto' to follow SGLang's /metrics.")
@click.option("--max-concurrency", default=1024, show_default=True, type=click.IntRange(1, 100_000),
              help="Hard cap on in-flight requests (also caps 'auto').")
@click.option("--commit-interval", "commit_interval_s", default=2.0, show_default=True,
              type=seconds(0.05, 5.0, min_open=False), help="Seconds between transactions.")
@click.option("--max-attempts", default=5, show_default=True, type=click.IntRange(1, 100),
              help="Attempts per prompt for 5xx, timeouts and aborts.")
@click.option("--retry-base", "retry_base_s", default=1.0, show_default=True,
              type=seconds(0, 3600, min_open=False),
              help="First retry delay in seconds (doubles, with jitter).")
@click.option("--request-timeout", "request_timeout_s", default=1800.0, show_default=True,
              type=seconds(0, 7 * 86400), help="Seconds before a request counts as timed out.")
@click.option("--drain-timeout", "drain_timeout_s", default=60.0, show_default=True,
              type=seconds(0, 86400, min_open=False),
              help="On SIGTERM, seconds to let in-flight requests finish.")
@click.option("--group-protocol", type=click.Choice(["consumer", "classic"]), default="consumer",
              show_default=True,
              help="consumer: KIP-848 (Kafka 4.0+), shares follow GPU capacity; classic: the "
                   "older protocol for older brokers.")
@transaction_timeout_option("worker", clients.TRANSACTION_TIMEOUT_S)
@click.option("--session-timeout", "session_timeout_s", default=None,
              type=seconds(1, 1800, min_open=False),
              help="Seconds a crashed worker keeps its partitions. KIP-848: set as the group's "
                   "consumer.session.timeout.ms (within the broker's bounds; default: the "
                   "broker's). Classic: the client's (default 30).")
@click.option("--static-membership/--no-static-membership", default=False, show_default=True,
              help="Classic protocol only: group.instance.id = instance.")
@click.option("--fleet-balancing/--no-fleet-balancing", default=True, show_default=True,
              help="KIP-848: open and close group members so that this worker's share of "
                   "partitions follows its measured throughput.")
@click.option("--breaker-cooldown", "breaker_cooldown_s", default=30.0, show_default=True,
              type=seconds(0.1, 3600, min_open=False),
              help="Seconds the circuit breaker holds prompts before probing the server "
                   "again (doubles while it keeps failing, up to --breaker-max-cooldown).")
@click.option("--breaker-max-cooldown", "breaker_max_cooldown_s", default=120.0,
              show_default=True, type=seconds(0.1, 86400, min_open=False),
              help="Seconds the circuit breaker waits at most between probes: how long a "
                   "server fixed by its operator may stay unused before the worker finds out "
                   "(a probe is one request).")
@click.option("--heartbeat-interval", "heartbeat_s", default=10.0, show_default=True,
              type=seconds(0.5, 600, min_open=False),
              help="Seconds between commits of an idle worker: `status` marks a worker "
                   "whose last commit is older than twice this as dead.")
@click.option("--fetch-stall", "fetch_stall_s", default=60.0, show_default=True,
              type=seconds(1, 3600, min_open=False),
              help="Seconds a held partition may stay silent, while the worker fetches and "
                   "committed prompts wait for it, before the worker exits so that its "
                   "supervisor restarts it (a Kafka client that stopped fetching after a "
                   "broker restart).")
@click.option("--until-done", is_flag=True,
              help="Exit 0 once the producer has finished and every prompt has a committed result.")
@click.option("--metrics-port", default=0, type=PORT_OR_OFF,
              help="Serve Prometheus /metrics here (0: off).")
@service_command
def consume(settings: Settings, run_id: str, sglang_url: str, instance: str | None,
            concurrency: int | None, max_concurrency: int, commit_interval_s: float,
            max_attempts: int,
            retry_base_s: float, request_timeout_s: float, drain_timeout_s: float,
            group_protocol: str, session_timeout_s: float | None,
            transaction_timeout_s: float, static_membership: bool,
            fleet_balancing: bool, breaker_cooldown_s: float, breaker_max_cooldown_s: float,
            heartbeat_s: float,
            fetch_stall_s: float, until_done: bool, metrics_port: int) -> None:
    """Generate completions for a run's prompts, exactly once, next to one SGLang server.

    At start it waits for Kafka, then for the server (up to --startup-timeout-s each).

    \b
    Example:
      tokenmill consume --run my-run --sglang-url http://127.0.0.1:30000 --instance gpu0
    """
    check_url(sglang_url)
    if breaker_max_cooldown_s < breaker_cooldown_s:
        raise click.BadParameter(f"{breaker_max_cooldown_s:g}s is shorter than --breaker-cooldown "
                                 f"({breaker_cooldown_s:g}s)", param_hint="--breaker-max-cooldown")
    instance = instance or default_instance(sglang_url)
    if not INSTANCE_PATTERN.match(instance):
        raise click.BadParameter(f"{instance!r}: use 1-100 letters, digits, '.', '_' or '-'",
                                 param_hint="--instance")
    api_key = sglang_api_key()
    laps = StartupLaps(before_s=process_age_s())
    clients.wait_for_broker(settings)
    laps.lap("kafka")
    spec = RunRegistry(settings).get(run_id)
    laps.lap("run spec")
    asyncio.run(wait_for_server(sglang_url, timeout_s=settings.startup_timeout_s,
                                api_key=api_key))
    laps.lap("server")
    config = WorkerConfig(
        instance=instance,
        sglang_url=sglang_url,
        concurrency=concurrency,
        max_concurrency=max_concurrency,
        commit_interval_s=commit_interval_s,
        retry=RetryPolicy(max_attempts=max_attempts, base_s=retry_base_s),
        request_timeout_s=request_timeout_s,
        drain_timeout_s=drain_timeout_s,
        group_protocol=group_protocol,  # type: ignore[arg-type]
        session_timeout_s=session_timeout_s,
        transaction_timeout_s=transaction_timeout_s,
        static_membership=static_membership,
        fleet_balancing=fleet_balancing,
        breaker_cooldown_s=breaker_cooldown_s,
        breaker_max_cooldown_s=breaker_max_cooldown_s,
        heartbeat_s=heartbeat_s,
        fetch_stall_s=fetch_stall_s,
        until_done=until_done,
        metrics_port=metrics_port,
        api_key=api_key,
    )
    finish_now(run_service(
        lambda: asyncio.run(Worker(settings, spec, config, startup=laps).run()),
        fatal=(FatalWorkerError,)))
