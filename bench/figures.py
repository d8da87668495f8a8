"""The raw output every benchmark writes with `--out`: each figure with the
method that produced it, and the machine it came from (CPU count, load
average before and after, date, command line). `bench/report.py` builds the
README's table from these files only, so the table can always be traced to
a run."""

from __future__ import annotations

import datetime
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec


class Figure(msgspec.Struct, kw_only=True):
    """One comparison. `tokenmill` and `baseline` are wall-clock figures in
    `unit`, measured in the same run; `ratio` is tokenmill / baseline (which
    direction is good is in `target`); CPU seconds are reported beside them,
    never instead of them."""

    name: str
    unit: str
    tokenmill: float
    baseline: float | None
    baseline_name: str | None
    ratio: float | None
    target: str
    met: bool
    method: str
    tokenmill_wall_s: float | None = None
    baseline_wall_s: float | None = None
    tokenmill_cpu_s: float | None = None
    baseline_cpu_s: float | None = None
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class Machine(msgspec.Struct, kw_only=True):
    cpu_count: int
    usable_cpus: int
    load_average: tuple[float, float, float]


class Results(msgspec.Struct, kw_only=True):
    benchmark: str
    date: str
    command: list[str]
    before: Machine
    after: Machine
    figures: list[Figure]


def machine() -> Machine:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    load = tuple(round(x, 2) for x in os.getloadavg())
    return Machine(cpu_count=os.cpu_count() or 1, usable_cpus=usable,
                   load_average=load)  # type: ignore[arg-type]


def ratio(tokenmill: float, baseline: float) -> float:
    return round(tokenmill / baseline, 3) if baseline else float("nan")


def median_paired_ratio(tokenmill: Sequence[float], baseline: Sequence[float]) -> float:
    """The median of tokenmill[i] / baseline[i]: each pair ran back to back,
    so a slow minute of a noisy machine moves one pair's two sides together
    instead of one side of the verdict."""
    if len(tokenmill) != len(baseline) or not tokenmill:
        raise ValueError(f"pairs needed, got {len(tokenmill)} and {len(baseline)} runs")
    return round(statistics.median(t / b for t, b in zip(tokenmill, baseline)), 3)


class Recorder:
    """Notes the machine when a benchmark starts; `write` adds the machine
    when it ends and the figures, and saves the JSON."""

    def __init__(self, benchmark: str) -> None:
        self.benchmark = benchmark
        script = Path(sys.argv[0]).resolve()
        root = Path(__file__).resolve().parent.parent
        shown = script.relative_to(root) if script.is_relative_to(root) else script
        self.command = ["python", shown.as_posix(), *sys.argv[1:]]
        self.before = machine()
        self.date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    def results(self, figures: list[Figure]) -> Results:
        return Results(benchmark=self.benchmark, date=self.date, command=self.command,
                       before=self.before, after=machine(), figures=figures)

    def write(self, path: Path | None, figures: list[Figure]) -> Results:
        results = self.results(figures)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(msgspec.json.format(msgspec.json.encode(results), indent=2) + b"\n")
        return results


def console_table(title: str, figures: list[Figure]) -> Any:
    """The figures as a rich table, wall clock first, CPU seconds apart."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("benchmark", "tokenmill (wall)", "baseline (wall)", "ratio", "target", "met",
                   "CPU-s tokenmill / baseline"):
        table.add_column(column)
    for f in figures:
        table.add_row(f.name, f"{f.tokenmill:,.6g} {f.unit}",
                      "-" if f.baseline is None else f"{f.baseline:,.6g} {f.unit}",
                      "-" if f.ratio is None else f"{f.ratio:.3f}", f.target,
                      "[green]yes[/]" if f.met else "[red]NO[/]", cpu_cell(f))
    return table


def cpu_cell(figure: Figure) -> str:
    def one(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}"

    if figure.tokenmill_cpu_s is None and figure.baseline_cpu_s is None:
        return "-"
    return f"{one(figure.tokenmill_cpu_s)} / {one(figure.baseline_cpu_s)}"


def read(path: Path) -> Results:
    return msgspec.json.decode(path.read_bytes(), type=Results)
