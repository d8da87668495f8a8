"""`tokenmill runs list|show`: the run registry, read-only."""

from __future__ import annotations

import click
import msgspec
from rich.console import Console
from rich.table import Table

from tokenmill.commandline import service_command
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings


@click.group()
def runs() -> None:
    """Registered runs (immutable specs in the tokenmill.runs topic)."""


@runs.command("list")
@service_command
def list_runs(settings: Settings) -> None:
    """One line per run.

    \b
    Example:
      tokenmill runs list
    """
    specs = RunRegistry(settings).all()
    table = Table(title=f"runs at {settings.bootstrap_servers}")
    for column in ("run", "partitions", "model", "max_tokens", "thinking", "multi-turn",
                   "settings hash", "parent"):
        table.add_column(column)
    for run_id, spec in sorted(specs.items()):
        g = spec.generation
        table.add_row(run_id, str(spec.partitions), g.model, str(g.max_tokens),
                      "on" if g.enable_thinking else "off", spec.multi_turn,
                      spec.settings_hash, spec.parent_run or "")
    Console().print(table)


@runs.command("show")
@click.argument("run_id")
@service_command
def show(settings: Settings, run_id: str) -> None:
    """The full spec of one run, as JSON.

    \b
    Example:
      tokenmill runs show my-run
    """
    spec = RunRegistry(settings).get(run_id)
    click.echo(msgspec.json.format(msgspec.json.encode(spec), indent=2).decode())
