"""The manual's benchmark table, rebuilt from the raw results the benchmarks
wrote (`bench/results/*.json`): wall-clock figures, the baseline measured in
the same run, the verdict, CPU seconds apart, and the method of each figure,
then the command, date and machine load of each run. The table lives
between `<!-- bench:start -->` and `<!-- bench:end -->` in docs/benchmarks.md;
a test fails when it differs from what this renders.

    python bench/report.py            # rewrite the table in docs/benchmarks.md
    python bench/report.py --check    # exit 1 if that table is stale
    python bench/report.py --page P   # another page (--readme P: the old name)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT))

from bench.figures import Figure, Results, cpu_cell, read

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
ORDER = ("bench_simulator", "bench_producer", "bench_consumer", "bench_turns", "bench_fleet",
         "bench_sink", "bench_seed_run", "bench_status_launch", "bench_worker_memory")
HEADER = ("| benchmark | tokenmill (wall clock) | baseline, same run (wall clock) | ratio "
          "| target | met | CPU-s tokenmill / baseline | method |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")


def number(value: float) -> str:
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"


def row(figure: Figure) -> str:
    baseline = "-" if figure.baseline is None else (
        f"{number(figure.baseline)} {figure.unit} ({figure.baseline_name})")
    cells = (figure.name, f"{number(figure.tokenmill)} {figure.unit}", baseline,
             "-" if figure.ratio is None else f"{figure.ratio:.3f}", figure.target,
             "yes" if figure.met else "**no**", cpu_cell(figure), figure.method)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def run_line(name: str, results: Results) -> str:
    before, after = results.before, results.after
    load = " / ".join(f"{x:.1f}" for x in before.load_average)
    load_after = " / ".join(f"{x:.1f}" for x in after.load_average)
    return (f"- `bench/results/{name}`: `{' '.join(results.command)}` on {results.date[:10]}, "
            f"{before.cpu_count} CPUs, load average (1/5/15 min) {load} before, "
            f"{load_after} after")


def ordered(results: dict[str, Results]) -> list[tuple[str, Results]]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(results.items(), key=lambda kv: (rank.get(kv[1].benchmark, len(ORDER)), kv[0]))


def render(results: dict[str, Results]) -> str:
    """The block between the markers, from {file name: results}."""
    runs = ordered(results)
    rows = [row(f) for _, r in runs for f in r.figures]
    note = "Ratio = tokenmill / baseline. Raw results and the runs behind them:"
    lines = [HEADER, *rows, "", note, "", *(run_line(name, r) for name, r in runs)]
    remarks = [f"- {f.name}: {text}" for _, r in runs for f in r.figures
               for text in f.details.get("notes", [])]
    if remarks:
        lines += ["", "Seen during these runs:", "", *remarks]
    return "\n".join(lines)


def load(directory: Path) -> dict[str, Results]:
    return {path.name: read(path) for path in sorted(directory.glob("*.json"))}


def replace_block(page: str, block: str) -> str:
    """`page` with the text between the markers replaced by `block`."""
    head, start, rest = page.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"the page has no {START} ... {END} section")
    return f"{head}{START}\n{block}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table is stale")
    parser.add_argument("--page", "--readme", dest="page", type=Path, default=PAGE,
                        help="the page holding the table (default: docs/benchmarks.md)")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    text = args.page.read_text()
    updated = replace_block(text, render(load(args.results)))
    if args.check:
        if updated != text:
            sys.exit(f"{args.page}: the benchmark table differs from {args.results}; "
                     "run python bench/report.py")
        return
    args.page.write_text(updated)


if __name__ == "__main__":
    main()
