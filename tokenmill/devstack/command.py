"""`tokenmill dev up|down|status|env`: the local stack."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from tokenmill.commandline import service_command
from tokenmill.devstack import stack
from tokenmill.settings import Settings

console = Console(stderr=True)


def _exports(state: stack.StackState) -> str:
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in state.env().items())


@click.group()
def dev() -> None:
    """A local Kafka broker and S3 server, no Docker needed."""


@dev.command()
@click.option("--kafka-port", default=9092, show_default=True, type=int)
@click.option("--controller-port", default=9093, show_default=True, type=int)
@click.option("--s3-port", default=9000, show_default=True, type=int)
@click.option("--bucket", default=stack.DEFAULT_BUCKET, show_default=True)
@click.option("--kafka-heap", default="1g", show_default=True, help="Broker JVM heap limit.")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, type=float,
              help="Seconds to wait for the services to answer.")
@service_command
def up(settings: Settings, kafka_port: int, controller_port: int, s3_port: int, bucket: str,
       kafka_heap: str, timeout_s: float) -> None:
    """Start the broker and the S3 server, wait until both answer, print exports.

    \b
    Example:
      eval "$(tokenmill dev up)"
    """
    plan = stack.StackPlan(
        state_dir=settings.state_dir, kafka_port=kafka_port, controller_port=controller_port,
        s3_port=s3_port, bucket=bucket, kafka_heap=kafka_heap, timeout_s=timeout_s,
    )
    started_at = time.monotonic()
    with console.status("starting Kafka and S3 (the first start fetches Kafka's jars)..."):
        state, started = stack.up(plan)
    what = "started" if started else "already running"
    console.print(
        f"[green]dev stack {what}[/] in {time.monotonic() - started_at:.1f}s: "
        f"Kafka {state.kafka.address}, S3 {state.s3.address} (bucket {state.bucket}); "
        f"state in {settings.state_dir}"
    )
    click.echo(_exports(state))


@dev.command()
@service_command
def down(settings: Settings) -> None:
    """Stop every process the dev stack started."""
    stopped = stack.down(settings.state_dir)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@dev.command()
@service_command
def status(settings: Settings) -> None:
    """What runs where."""
    state = stack.read_state(settings.state_dir)
    if state is None:
        console.print(f"the dev stack is not running (state dir {settings.state_dir})")
        raise SystemExit(1)
    alive = stack.running(state)
    table = Table(title=f"dev stack ({Path(settings.state_dir).resolve()})")
    for column in ("service", "state", "address", "pid", "log"):
        table.add_column(column)
    for name, service in (("kafka", state.kafka), ("s3", state.s3)):
        table.add_row(name, "[green]up[/]" if alive[name] else "[red]down[/]", service.address,
                      str(service.pid), service.log)
    Console().print(table)
    if not all(alive.values()):
        raise SystemExit(1)


@dev.command()
@service_command
def env(settings: Settings) -> None:
    """Print the exports that point tokenmill at the running dev stack.

    \b
    Example:
      eval "$(tokenmill dev env)"
    """
    state = stack.read_state(settings.state_dir)
    if state is None:
        raise click.ClickException("the dev stack is not running; start it with `tokenmill dev up`")
    click.echo(_exports(state))
