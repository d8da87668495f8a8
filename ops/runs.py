"""`tokenmill runs list|show`: the run registry, read-only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
import msgspec
from rich.console import Console
from rich.table import Table

from ops.dataset.lineage import kind_of
from ops.redrive import RedriveRefused, parse_reasons, run_redrive
from ops.replay import ReplayRefused, create_replay
from producer.errors import ProducerError
from schemas.run import DLQ_REASONS
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID, FiniteFloat, TopK
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])

register_known_error(ReplayRefused, RedriveRefused, ProducerError)


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
                   "settings hash", "parent", "origin"):
        table.add_column(column)
    for run_id, spec in sorted(specs.items()):
        g = spec.generation
        kind = kind_of(spec)
        origin = f"redrive {','.join(spec.origin.reasons)}" if kind == "redrive" else kind
        table.add_row(run_id, str(spec.partitions), g.model, str(g.max_tokens),
                      "on" if g.enable_thinking else "off", spec.multi_turn,
                      spec.settings_hash, spec.parent_run or "", origin)
    Console().print(table)


@runs.command("show")
@click.argument("run_id", type=RUN_ID)
@service_command
def show(settings: Settings, run_id: str) -> None:
    """The full spec of one run, as JSON.

    \b
    Example:
      tokenmill runs show my-run
    """
    spec = RunRegistry(settings).get(run_id)
    click.echo(msgspec.json.format(msgspec.json.encode(spec), indent=2).decode())


def generation_options(func: F) -> F:
    """The generation settings a replay or redrive may change; unset flags
    keep the parent's value."""
    for option in reversed([
        click.option("--model", default=None),
        click.option("--max-tokens", type=click.IntRange(min=1), default=None),
        click.option("--temperature", type=FiniteFloat(min=0.0), default=None),
        click.option("--top-p", type=FiniteFloat(min=0.0, max=1.0, min_open=True), default=None),
        click.option("--top-k", type=TopK(), default=None, help="-1: off."),
        click.option("--seed", type=int, default=None),
        click.option("--thinking/--no-thinking", default=None),
    ]):
        func = option(func)
    return func


def generation_changes(model: str | None, max_tokens: int | None, temperature: float | None,
                       top_p: float | None, top_k: int | None, seed: int | None,
                       thinking: bool | None) -> dict[str, Any]:
    return {k: v for k, v in {
        "model": model, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
        "top_k": top_k, "seed": seed, "enable_thinking": thinking}.items() if v is not None}


@runs.command("replay")
@click.argument("run_id", type=RUN_ID)
@click.option("--parent", "parent_id", required=True, type=RUN_ID,
              help="The run whose prompts to reuse.")
@generation_options
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
    generation = generation_changes(model, max_tokens, temperature, top_p, top_k, seed, thinking)
    spec, created = create_replay(settings, parent_id, run_id, generation, {})
    click.echo(f"{'created' if created else 'already exists:'} run {run_id} replaying "
               f"{parent_id} from {spec.prompts_topic} (settings {spec.settings_hash})")


@runs.command("redrive")
@click.argument("run_id", type=RUN_ID)
@click.option("--parent", "parent_id", required=True, type=RUN_ID,
              help="The finished run whose dead letters to regenerate.")
@click.option("--reasons", required=True,
              help=f"Comma list of DLQ reasons to redrive ({','.join(sorted(DLQ_REASONS))}).")
@click.option("--from-failed-turn", is_flag=True,
              help="regenerate-turns runs: resume each conversation at the step that failed, "
                   "carrying the turns the parent generated before it (none generated twice).")
@generation_options
@click.option("--transaction-records", type=click.IntRange(min=1), default=20_000,
              show_default=True, help="Prompts per Kafka transaction at most.")
@click.option("--progress/--no-progress", "show_progress", default=None,
              help="Progress bar on stderr [default: when stderr is a terminal].")
@service_command
def redrive(settings: Settings, run_id: str, parent_id: str, reasons: str,
            from_failed_turn: bool, model: str | None,
            max_tokens: int | None, temperature: float | None, top_p: float | None,
            top_k: int | None, seed: int | None, thinking: bool | None,
            transaction_records: int, show_progress: bool | None) -> None:
    """Create RUN_ID: the parent's dead letters with REASONS, generated again.

    Publishes each prompt of the parent's DLQ with one of the reasons once
    (deduplicated by prompt id) to RUN_ID's own prompts topic, exactly once:
    run the same command again after a crash and it resumes. Unset generation
    flags keep the parent's value. Redrives chain: redrive a redrive.

    A regenerate-turns run's dead letters are conversations: each is generated
    again from its first turn, or with --from-failed-turn from the step that
    failed, after the turns the parent generated before it (carried as they
    are: they were the model's own).

    \b
    Example:
      tokenmill runs redrive r1-8k --parent r1 --reasons length --max-tokens 8192
      tokenmill runs redrive chats-2 --parent chats --reasons failed,length --from-failed-turn
      tokenmill consume --run r1-8k --sglang-url http://127.0.0.1:30000
    """
    try:
        chosen = parse_reasons(reasons)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--reasons") from None
    generation = generation_changes(model, max_tokens, temperature, top_p, top_k, seed, thinking)
    out = Console() if Console().is_terminal else Console(width=160)
    outcome = run_redrive(settings, parent_id, run_id, generation, chosen,
                          from_failed_turn=from_failed_turn,
                          transaction_records=transaction_records, show_progress=show_progress,
                          out=out)
    if outcome.spooled is not None:
        counts = ", ".join(f"{r} {n:,}" for r, n in sorted(outcome.spooled.by_reason.items()))
        resumed = (f"; {outcome.spooled.resumed:,} resume at their failed turn"
                   if from_failed_turn else "")
        out.print(f"run {run_id} redrives {outcome.total:,} prompts of {parent_id} ({counts}) "
                  f"with settings {outcome.spec.settings_hash}{resumed}")
