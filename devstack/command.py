"""`tokenmill dev up|down|status|env`: the local stack."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from devstack import container_engine, images, secure, stack
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import HEAP, PORT, Pattern, seconds
from tokenmill.settings import BUCKET_PATTERN, Settings, writable_state_dir

register_known_error(*stack.SETUP_ERRORS)

console = Console(stderr=True)


def _exports(state: stack.StackState, role: str | None = None) -> str:
    """The shell's exports; on a secured stack, logged in as `role` (default
    admin), with every role's login as a comment ready to paste."""
    env = state.env()
    if state.security is None:
        return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    env.update(secure.role_env(state.security, role or secure.ADMIN))
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append("# Each role's login (`tokenmill dev env --role ROLE` prints its exports):")
    for name in (*secure.ROLES, secure.ADMIN):
        login = " ".join(f"{k}={shlex.quote(v)}"
                         for k, v in secure.role_env(state.security, name).items())
        lines.append(f"#   {name:<8}  export {login}")
    return "\n".join(lines)


@click.group()
def dev() -> None:
    """A local Kafka broker and S3 server (no Docker needed), and container images."""


@dev.command()
@click.option("--brokers", default=1, show_default=True, type=click.IntRange(1, 5),
              help="Kafka nodes (KRaft, broker+controller each); 3 gives replication factor 3 "
                   "with min.insync.replicas 2. Node i listens on --kafka-port + 2i and "
                   "--controller-port + 2i.")
@click.option("--kafka-port", default=9092, show_default=True, type=PORT)
@click.option("--controller-port", default=9093, show_default=True, type=PORT)
@click.option("--s3-port", default=9000, show_default=True, type=PORT)
@click.option("--s3", "s3_kind", default="moto", show_default=True,
              type=click.Choice(stack.S3_KINDS),
              help="The S3 server: moto (in memory, starts in 2 s) or ceph (a real object "
                   "store: Ceph's S3 gateway on a one-node cluster, from Debian's packages, "
                   "installed when missing as root; starts in about 10 s; its objects last "
                   "across restarts).")
@click.option("--bucket", default=stack.DEFAULT_BUCKET, show_default=True,
              type=Pattern(BUCKET_PATTERN.pattern, "expected an S3 bucket name"))
@click.option("--kafka-heap", default="1g", show_default=True, type=HEAP,
              help="Heap limit of each broker JVM.")
@click.option("--timeout", "timeout_s", default=120.0, show_default=True, type=seconds(0, 3600),
              help="Seconds to wait for the services to answer.")
@click.option("--secure", "secured", is_flag=True,
              help="SASL_SSL (SCRAM-SHA-512) with TLS from a CA made in the state directory, "
                   "ACLs enforced, and one principal per role (producer, worker, sink, reader; "
                   "admin grants ACLs). The exports log in as admin and list every role's.")
@service_command
def up(settings: Settings, brokers: int, kafka_port: int, controller_port: int, s3_port: int,
       s3_kind: str, bucket: str, kafka_heap: str, timeout_s: float, secured: bool) -> None:
    """Start the brokers and the S3 server (or whichever of them is down),
    wait until they answer, print exports.

    \b
    Example:
      eval "$(tokenmill dev up)"
      eval "$(tokenmill dev up --brokers 3)"
      eval "$(tokenmill dev up --secure)"
      eval "$(tokenmill dev up --s3 ceph)"
    """
    ports = [*(kafka_port + 2 * i for i in range(brokers)),
             *(controller_port + 2 * i for i in range(brokers)), s3_port]
    if max(ports) > 65535 or len(set(ports)) < len(ports):
        raise click.UsageError(f"--kafka-port, --controller-port and --s3-port must leave "
                               f"{len(ports)} distinct ports up to 65535 for {brokers} "
                               "broker(s) (node i uses --kafka-port + 2i and "
                               "--controller-port + 2i)")
    plan = stack.StackPlan.on_ports(
        writable_state_dir(settings), kafka_port=kafka_port, controller_port=controller_port,
        brokers=brokers, s3_port=s3_port, s3_kind=s3_kind, bucket=bucket, kafka_heap=kafka_heap,
        timeout_s=timeout_s, secure=secured,
    )
    started_at = time.monotonic()
    with console.status("starting Kafka and S3...") as spinner:
        state, started = stack.up(plan, on_progress=spinner.update)
    if not started:
        what = "already running"
    elif len(started) == len(state.services()):
        what = "started"
    else:
        what = f"restarted {', '.join(started)} (the rest was running)"
    console.print(
        f"[green]dev stack {what}[/] in {time.monotonic() - started_at:.1f}s: "
        f"Kafka {state.bootstrap}{' (SASL_SSL, ACLs on)' if state.security else ''}, "
        f"S3 ({state.s3_kind}) {state.s3.address} (bucket {state.bucket}); "
        f"state in {settings.state_dir}"
    )
    if state.security is not None:
        console.print("the roles have no ACLs yet: as admin, `tokenmill deploy acls --run RUN "
                      "--apply` grants a run's; `tokenmill dev env --role ROLE` logs a shell in")
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
    for service in state.services():
        table.add_row(service.name, "[green]up[/]" if alive[service.name] else "[red]down[/]",
                      service.address, str(service.pid), service.log)
    Console().print(table)
    if not all(alive.values()):
        raise SystemExit(1)


@dev.command()
@click.option("--role", type=click.Choice([*secure.ROLES, secure.ADMIN]), default=None,
              help="A secured stack (`dev up --secure`): log in as this principal "
                   "(default admin).")
@service_command
def env(settings: Settings, role: str | None) -> None:
    """Print the exports that point tokenmill at the running dev stack.

    \b
    Example:
      eval "$(tokenmill dev env)"
      eval "$(tokenmill dev env --role worker)"
    """
    state = stack.read_state(settings.state_dir)
    if state is None:
        raise click.ClickException("the dev stack is not running; start it with `tokenmill dev up`")
    if role is not None and state.security is None:
        raise click.UsageError("--role needs a secured stack (`tokenmill dev up --secure`)")
    click.echo(_exports(state, role))


@dev.command(name="images")
@click.option("--source", default=str(images.PROJECT_ROOT), show_default="this checkout",
              type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="tokenmill's source checkout (its wheel goes into the tokenmill image).")
def build_images(source: Path) -> None:
    """Build the container images locally with podman, from Debian's packages,
    Maven Central and PyPI: base, Kafka 4.1.1 KRaft, S3 (moto), tokenmill's
    dependencies and tokenmill.
    Installs and configures podman first when it is missing (root, Debian).
    Cached: images whose inputs did not change are not rebuilt.

    \b
    Example:
      tokenmill dev images && tokenmill deploy compose --out stack
    """
    started_at = time.monotonic()
    try:
        with console.status("building container images...") as spinner:
            built = images.build_images(source, on_progress=spinner.update)
    except (images.ImageBuildError, container_engine.EngineError) as exc:
        raise click.ClickException(str(exc)) from exc
    console.print(f"[green]images ready[/] in {time.monotonic() - started_at:.1f}s")
    for ref in built.all():
        click.echo(f"{ref}  (also {images.local_name(ref)})")

