"""`tokenmill deploy acls`: the Kafka ACLs each role needs for a run (or a
prefix of runs), printed as `kafka-acls.sh` commands or JSON, or created
through the Admin API (`--apply`). The ACLs themselves come from one pure
function, `tokenmill.kafka.acls.role_acls`."""

from __future__ import annotations

import time
from typing import Any

import click
from confluent_kafka import KafkaException
from rich.console import Console

from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID, Pattern
from tokenmill.kafka import acls, clients
from tokenmill.settings import Settings

console = Console(stderr=True)


class PrincipalType(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    name = "Type:name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        problem = acls.principal_problem(str(value))
        if problem:
            self.fail(f"{value!r}: {problem}", param, ctx)
        return str(value)


PRINCIPAL = PrincipalType()
RUN_PREFIX = Pattern(r"^[A-Za-z0-9_-]{0,100}$",
                     "a run id prefix is up to 100 letters, digits, '_' or '-' (empty: every run)")


class AclsRefused(RuntimeError):
    """The broker would not create the ACLs."""


def apply_acls(settings: Settings, entries: list[acls.Acl], timeout_s: float = 30.0) -> int:
    """Create `entries` as the settings' principal (which needs ALTER on the
    cluster) and wait until the broker enforces them; the number created.
    Creating an ACL that exists is a no-op."""
    clients.check_broker(settings)
    admin = clients.admin(settings)
    wanted = acls.bindings(entries)
    who = f" as {settings.sasl_username!r}" if settings.sasl_username else ""
    try:
        for future in admin.create_acls(wanted, request_timeout=timeout_s).values():
            future.result()
        # The controller has committed them; the broker's authorizer applies
        # them when it replays the metadata: wait until it lists them all.
        deadline = time.monotonic() + timeout_s
        while not set(wanted) <= set(admin.describe_acls(
                acls.any_binding(), request_timeout=timeout_s).result()):
            if time.monotonic() > deadline:
                raise AclsRefused(f"the ACLs created at {settings.bootstrap_servers} were not "
                                  f"in effect after {timeout_s:.0f}s")
            time.sleep(0.1)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        raise AclsRefused(f"Kafka at {settings.bootstrap_servers} would not create the "
                          f"ACLs{who}: {error}; creating ACLs needs ALTER on the cluster, "
                          "listing them DESCRIBE, and an authorizer on the broker") from None
    return len(wanted)


register_known_error(AclsRefused)


@click.command(name="acls")
@click.option("--run", "run_id", type=RUN_ID, default=None,
              help="The run the ACLs are for (exact: each topic and group named).")
@click.option("--run-prefix", type=RUN_PREFIX, default=None,
              help="Every run whose id starts with this (coarse: a prefix cannot tell a run's "
                   "topics apart; the output says what that grants). '' is every run.")
@click.option("--parent-run", "parents", type=RUN_ID, multiple=True,
              help="With --run: a run it replays or redrives from (repeat up to the root).")
@click.option("--producer-principal", default=acls.DEFAULT_PRINCIPALS["producer"],
              show_default=True, type=PRINCIPAL, help="Who runs `tokenmill produce`.")
@click.option("--worker-principal", default=acls.DEFAULT_PRINCIPALS["worker"],
              show_default=True, type=PRINCIPAL, help="Who runs `tokenmill consume`.")
@click.option("--sink-principal", default=acls.DEFAULT_PRINCIPALS["sink"],
              show_default=True, type=PRINCIPAL, help="Who runs `tokenmill sink`.")
@click.option("--reader-principal", default=acls.DEFAULT_PRINCIPALS["reader"],
              show_default=True, type=PRINCIPAL,
              help="Who runs `tokenmill status`, `spot-check`, `dataset`, `export`, `report`.")
@click.option("--format", "output", type=click.Choice(["commands", "json"]), default="commands",
              show_default=True, help="kafka-acls.sh commands, or JSON (one object per ACL).")
@click.option("--command-config", default="admin.properties", show_default=True,
              help="The admin client properties file the printed commands pass to "
                   "kafka-acls.sh.")
@click.option("--apply", "apply_now", is_flag=True,
              help="Create the ACLs through the Admin API, logged in with the shared settings "
                   "(a principal with ALTER on the cluster), instead of printing them.")
@service_command
def acls_command(settings: Settings, run_id: str | None, run_prefix: str | None,
                 parents: tuple[str, ...], producer_principal: str, worker_principal: str,
                 sink_principal: str, reader_principal: str, output: str, command_config: str,
                 apply_now: bool) -> None:
    """The Kafka ACLs each role needs (producer, worker, sink, reader): topics,
    groups and transactional ids, nothing else.

    \b
    Example:
      tokenmill deploy acls --run qwen-r1 > acls.sh
      tokenmill deploy acls --run qwen-r1 --format json
      tokenmill deploy acls --run qwen-r1 --apply     # as a principal with ALTER on the cluster
    """
    if (run_id is None) == (run_prefix is None):
        raise click.UsageError("give one of --run RUN and --run-prefix PREFIX")
    if parents and run_id is None:
        raise click.UsageError("--parent-run goes with --run")
    scope = acls.Scope(run=run_id, run_prefix=run_prefix, parents=parents)
    principals = {"producer": producer_principal, "worker": worker_principal,
                  "sink": sink_principal, "reader": reader_principal}
    entries = acls.role_acls(scope, principals)
    if apply_now:
        created = apply_acls(settings, entries)
        console.print(f"created {created} ACLs for {scope.describe()} at "
                      f"{settings.bootstrap_servers}")
        for note in acls.notes(scope):
            console.print(f"note: {note}")
        return
    if output == "json":
        click.echo(acls.acls_json(entries, scope))
        return
    exact = ("each role exactly what its commands do" if scope.run is not None
             else "coarse, see the note")
    header = [f"# Kafka ACLs for {scope.describe()}: {len(entries)} ACL entries, {exact} "
              "(tokenmill deploy acls).",
              *(f"# note: {note}" for note in acls.notes(scope))]
    click.echo("\n".join([*header, "",
                          *acls.kafka_acls_commands(entries, bootstrap=settings.bootstrap_servers,
                                                    command_config=command_config)]))
