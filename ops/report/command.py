"""`tokenmill report RUN --out DIR`: the page (report.html) and its numbers
(report.json) for a run, or the dataset of its lineage."""

from __future__ import annotations

import time
from pathlib import Path

import click

from ops.report.build import DATA, PAGE, ReportRefused, WriteFile, build_figures, write_report
from sink.service import tune_gc
from tokenmill.commandline import register_known_error, service_command
from tokenmill.flag_types import RUN_ID
from tokenmill.settings import Settings

register_known_error(ReportRefused)


@click.command("report")
@click.argument("run_id", type=RUN_ID)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for report.html and report.json (created if missing).")
@service_command
def report(settings: Settings, run_id: str, out: Path) -> None:
    """Charts of RUN_ID's results on one self-contained HTML page.

    Output lengths by category against max_tokens, finish and dead-letter
    reasons by category and source, thinking present or absent, speculative
    accept lengths overall and per GPU, throughput per GPU over time and
    progress against the plan, turns and tool rounds of conversations.
    report.json beside the page holds the same numbers. A run that is part of
    a lineage (replays, redrives) reports the lineage's dataset: each prompt
    once, as `tokenmill export` writes it.

    \b
    Examples:
      tokenmill report r1 --out reports/r1/
      tokenmill report r1-16k --out reports/r1-lineage/
    """
    tune_gc()
    started = time.monotonic()
    found = build_figures(settings, run_id)
    write_report(WriteFile(out), found)
    click.echo(f"report of {found.records:,} results ({found.accepted:,} accepted, "
               f"{found.dead_letters:,} dead-lettered) in {time.monotonic() - started:.1f}s: "
               f"{out / PAGE} ({out / DATA} holds the numbers)")
