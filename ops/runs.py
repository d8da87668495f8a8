"""`tokenmill runs list|show`: the run registry, read-only."""

from __future__ import annotations

import click
import msgspec
from rich.console import Console
from rich.table import Table

from ops.replay import ReplayRefused, create_replay
from tokenmill.commandline import register_known_error, service_command
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

register_known_error(ReplayRefused)


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


@runs.command("replay")
@click.argument("run_id")
@click.option("--parent", "parent_id", required=True, help="The run whose prompts to reuse.")
@click.option("--model", default=None)
@click.option("--max-tokens", type=click.IntRange(min=1), default=None)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=None)
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0), default=None)
@click.option("--top-k", type=int, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--thinking/--no-thinking", default=None)
@service_command
def replay(settings: Settings, run_id: str, parent_id: str, model: str | None,
           max_tokens: int | None, temperature: float | None, top_p: float | None,
           top_k: int | None, seed: int | None, thinking: bool | None) -> None:
    """Create RUN_ID: the parent's prompts again, with other generation settings.

    Consumers of RUN_ID read the parent's prompts topic in a group of their own;
    completions, DLQ and S3 objects are RUN_ID's own. Unset flags keep the
    parent's value.

    \b
    Example:
      tokenmill runs replay r1-8k --parent r1 --max-tokens 8192
      tokenmill consume --run r1-8k --sglang-url http://127.0.0.1:30000
    """
    generation = {k: v for k, v in {
        "model": model, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
        "top_k": top_k, "seed": seed, "enable_thinking": thinking}.items() if v is not None}
    spec, created = create_replay(settings, parent_id, run_id, generation, {})
    click.echo(f"{'created' if created else 'already exists:'} run {run_id} replaying "
               f"{parent_id} from {spec.prompts_topic} (settings {spec.settings_hash})")
