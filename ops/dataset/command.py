"""`tokenmill dataset RUN`: what the lineage's dataset holds, and what it lacks.

For every prompt of the lineage's root, the accepted result of the newest run
that has one: counts by run of origin with the settings each part was
generated with, and the prompts still without one by their last reason.
"""

from __future__ import annotations

from typing import Any

import click
import msgspec
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from ops.dataset.index import DatasetSummary
from ops.dataset.lineage import LineageError, describe, kind_of
from ops.dataset.sources import Lineage, build_index, load_lineage
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID
from tokenmill.settings import Settings

register_known_error(LineageError)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def unit_of(found: Lineage) -> str:
    """What the lineage's prompts are: a regenerate-turns run's are conversations."""
    return ("conversations" if found.specs[0].multi_turn == "regenerate-turns"
            else "prompts")


def report(found: Lineage, summary: DatasetSummary) -> dict[str, Any]:
    """The numbers (pure: `--json` prints them, `render` shows them)."""
    parts = []
    for spec, facts, tally in zip(found.specs, found.facts, summary.runs):
        parts.append({
            "run": spec.run_id, "kind": kind_of(spec), "parent": spec.parent_run,
            "reasons": list(spec.origin.reasons), "settings_hash": spec.settings_hash,
            "generation": msgspec.to_builtins(spec.generation), "complete": facts.complete,
            "prompts": tally.holds, "results": tally.winners, "accepted": facts.accepted,
            "rejected": dict(sorted(tally.rejected.items())), "open": tally.open,
        })
    without = [{"run": run, "reason": reason, "prompts": count,
                "examples": summary.samples.get((run, reason), [])}
               for (run, reason), count in sorted(summary.without.items(),
                                                  key=lambda kv: (-kv[1], kv[0]))]
    return {
        "run": found.specs[-1].run_id, "root": found.specs[0].run_id, "unit": unit_of(found),
        "prompts": summary.prompts, "with_result": summary.covered_low,
        "with_result_at_most": summary.covered_high, "exact": summary.exact,
        "complete": found.complete, "parts": parts, "without_result": without,
        "anomalies": dict(summary.anomalies),
    }


def render(found: Lineage, r: dict[str, Any]) -> Group:
    chain = "\n".join(describe(spec) for spec in found.specs)
    header = Panel(chain, title=f"lineage of {r['run']} (root {r['root']})")
    parts = Table(title="accepted results by run of origin", expand=True)
    for column in ("run", "origin", "model", "max_tokens", "thinking", "settings",
                   "prompts", "results", "share", "rejected"):
        parts.add_column(column, justify="right" if column in (
            "max_tokens", "prompts", "results", "share") else "left")
    for p in r["parts"]:
        g = p["generation"]
        origin = p["kind"] + (f" {','.join(p['reasons'])}" if p["reasons"] else "")
        rejected = ", ".join(f"{k} {v:,}" for k, v in p["rejected"].items()) or "-"
        if not p["complete"]:
            rejected += f"; in progress ({p['open']:,} open, {p['accepted']:,} in S3 so far)"
        parts.add_row(p["run"], origin, g["model"], str(g["max_tokens"]),
                      "on" if g["enable_thinking"] else "off", p["settings_hash"],
                      f"{p['prompts']:,}", f"{p['results']:,}",
                      _pct(p["results"], r["prompts"]), rejected)
    missing = Table(title=f"{r['unit']} without an accepted result, by their last word",
                    expand=True)
    for column in ("last run", "reason", r["unit"], "examples"):
        missing.add_column(column, justify="right" if column == r["unit"] else "left")
    for w in r["without_result"]:
        missing.add_row(w["run"], w["reason"], f"{w['prompts']:,}", " ".join(w["examples"]))
    covered = (f"{r['with_result']:,}" if r["exact"]
               else f"{r['with_result']:,}-{r['with_result_at_most']:,}")
    verdict = (f"{covered} of {r['prompts']:,} {r['unit']} have an accepted result "
               f"({_pct(r['with_result'], r['prompts'])})"
               + ("" if r["complete"] else "; runs in progress: counts will move"))
    items: list[Any] = [header, parts, missing if r["without_result"] else
                        f"[green]every one of the {r['unit']} has an accepted result[/]",
                        verdict]
    for message, count in r["anomalies"].items():
        items.append(f"[red]inconsistent:[/] {message} ({count:,})")
    return Group(*items)


@click.command("dataset")
@click.argument("run_id", type=RUN_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
@service_command
def dataset(settings: Settings, run_id: str, as_json: bool) -> None:
    """The dataset of RUN_ID's lineage: for every prompt of its root, the
    accepted result of the newest run (replay or redrive) that has one.

    Shows accepted results by run of origin with the settings each part was
    generated with, and the prompts still without one by their last reason.
    Reads each run's DLQ topic and committed counters, not S3.

    \b
    Example:
      tokenmill dataset r1-8k
      tokenmill dataset r1 --json
    """
    found = load_lineage(settings, run_id)
    summary = build_index(settings, found).summary()
    numbers = report(found, summary)
    if as_json:
        click.echo(msgspec.json.encode(numbers).decode())
    else:
        Console().print(render(found, numbers))
