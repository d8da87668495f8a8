"""`tokenmill spot-check --run RUN`: read a few committed results and show
what they really contain (roles of the prompt, reasoning, answer, tool calls,
finish reason) and where each goes (an S3 object, or the dead-letter topic
and why). The seed run's operator asked "how did we handle multi-turn?" and
"are tool prompts generated?" - this answers from the data itself;
`--summary` gives the table they built by hand, from a sample.

Dataset text is printed verbatim: every cell is a `rich.text.Text` of text
made safe by `ops.verbatim` (no markup is ever parsed, no control character
reaches the terminal).
"""

from __future__ import annotations

import click
import msgspec
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ops.destination import KeyFinder, route
from ops.spot_filter import CATEGORIES, REASONS, Filters, matches
from ops.spot_sample import Picked, pick, read_sample
from ops.spot_summary import render, summarize
from ops.verbatim import excerpt
from schemas import Completion, Conversation, Failure, RunSpec
from tokenmill.commandline import service_command
from tokenmill.flag_types import RUN_ID
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

TOOL_ARGS_WIDTH = 60


def _raw_text(value: bytes | None) -> str | None:
    """A raw record's bytes as text; bytes that are not UTF-8 become lone
    surrogates, which `excerpt` shows as `\\udcXX` (the byte XX)."""
    return None if value is None else value.decode("utf-8", "surrogateescape")


def where(picked: Picked, spec: RunSpec, finder: KeyFinder | str) -> Text:
    """'S3: <key>' (or why the key is not known) or 'dead-letter topic: <reason>'."""
    found = route(picked.record, spec)
    if found.target == "dlq":
        label = Text("dead-letter topic: ", style="red")
        label.append(found.reason or "?", style="bold red")
        return label
    if isinstance(finder, str):
        return Text(f"S3 (key unknown: {finder})", style="green")
    return Text(finder.label(picked.partition, picked.offset), style="green")


def record_table(picked: Picked, destination: Text, width: int) -> Table:
    """One record as a two-column table; every value is verbatim Text."""
    record = picked.record
    prompt = record.prompt
    title = (f"{record.id}  ({prompt.category}, {prompt.source}:{prompt.line}, "
             f"{prompt.format})  partition {picked.partition} offset {picked.offset}")
    table = Table(title=Text(excerpt(title, max(width, 100))), show_header=False, expand=True)
    table.add_column(Text("field"), style="bold", no_wrap=True)
    table.add_column(Text("value"))
    turns = Text(" → ".join(m.role for m in prompt.messages) + " → ")
    turns.append("assistant (generated)", style="green")
    table.add_row(Text("prompt turns"), turns)
    last_user = next((m.content for m in reversed(prompt.messages) if m.role == "user"), None)
    table.add_row(Text("last user turn"), Text(excerpt(last_user, width)))
    if prompt.tools:
        names = [str(t.get("function", {}).get("name", "?")) for t in prompt.tools]
        table.add_row(Text("tools offered"), Text(excerpt(", ".join(names), width)))
    if isinstance(record, Failure):
        failure = Text(record.failure, style="red")
        failure.append(": " + excerpt(record.error, width))
        table.add_row(Text("failure"), failure)
        if record.raw is not None:
            table.add_row(Text("record as read"), Text(excerpt(_raw_text(record.raw.value),
                                                               width)))
    elif isinstance(record, Conversation):
        for index, step in enumerate(record.steps):
            calls = "; ".join(f"{c.function.name}({c.function.arguments})"
                              for c in step.tool_calls or ())
            said = excerpt(step.content, width) + (f"  [tool calls: {excerpt(calls, width)}]"
                                                   if calls else "")
            table.add_row(Text(f"step {index} (turn {step.turn})"),
                          Text(f"{said}  ({step.finish_reason}, "
                               f"{step.usage.completion_tokens} tokens)"))
        table.add_row(Text("outcome"), Text(record.outcome))
    else:
        assert isinstance(record, Completion)
        table.add_row(Text("reasoning"), Text(excerpt(record.reasoning_content, width)))
        table.add_row(Text("answer"), Text(excerpt(record.content, width)))
        if record.tool_calls:
            calls = "; ".join(f"{c.function.name}({c.function.arguments})"
                              for c in record.tool_calls)
            table.add_row(Text("tool calls"), Text(excerpt(calls, width)))
        table.add_row(Text("finish"), Text(
            f"{excerpt(record.finish_reason, width)}  ({record.usage.completion_tokens} "
            f"tokens, {record.usage.reasoning_tokens} reasoning)"))
    table.add_row(Text("goes to"), destination)
    return table


@click.command("spot-check")
@click.option("--run", "run_id", required=True, type=RUN_ID)
@click.option("-n", "count", default=3, show_default=True, type=click.IntRange(1, 100),
              help="Records to show.")
@click.option("--category", type=click.Choice(CATEGORIES), default=None,
              help="Only prompts of this category.")
@click.option("--finish", default=None, help="Only completions with this finish reason "
                                             "(e.g. stop, length, tool_calls).")
@click.option("--reason", type=click.Choice(REASONS), default=None,
              help="Only records dead-lettered for this reason.")
@click.option("--source", default=None, help="Only prompts from this dataset file name.")
@click.option("--seed", default=0, show_default=True, help="Which partitions to look at first.")
@click.option("--width", default=100, show_default=True, type=click.IntRange(10, 100_000),
              help="Characters of text to show per field.")
@click.option("--summary", is_flag=True,
              help="Summarize a sample of committed records instead of showing a few.")
@click.option("--sample", default=2000, show_default=True, type=click.IntRange(1, 1_000_000),
              help="--summary: records to read, spread evenly over the partitions.")
@click.option("--json", "as_json", is_flag=True, help="--summary: print it as JSON.")
@service_command
def spot_check(settings: Settings, run_id: str, count: int, category: str | None,
               finish: str | None, reason: str | None, source: str | None, seed: int,
               width: int, summary: bool, sample: int, as_json: bool) -> None:
    """Show a few committed results of a run, as they will be stored, and
    where each goes (S3 or the dead-letter topic); or --summary of a sample.

    \b
    Examples:
      tokenmill spot-check --run my-run --category multi-turn -n 3
      tokenmill spot-check --run my-run --reason length --source chats.jsonl
      tokenmill spot-check --run my-run --summary --sample 5000
    """
    if as_json and not summary:
        raise click.UsageError("--json goes with --summary")
    spec = RunRegistry(settings).get(run_id)
    filters = Filters(category=category, finish=finish, reason=reason, source=source)
    console = Console(highlight=False)
    if summary:
        records = [p.record for p in read_sample(settings, run_id, sample)
                   if matches(p.record, spec, filters)]
        result = summarize(records, spec)
        if as_json:
            click.echo(msgspec.json.encode(result).decode())
            return
        described = filters.describe()
        console.print(render(result, f"a sample of up to {sample:,}"
                                     + (f", {described}" if described else "")))
        return
    picked = pick(settings, run_id, count, lambda r: matches(r, spec, filters), seed)
    if not picked:
        described = filters.describe()
        console.print(Text("no committed results" + (f" with {described}" if described else "")
                           + " yet"))
        return
    finder = KeyFinder.for_run(settings, spec)
    for item in picked:
        console.print(record_table(item, where(item, spec, finder), width))
