"""The manual's benchmark table (docs/benchmarks.md) is what bench/report.py renders from the
committed raw results, and every committed figure is a wall-clock figure
whose verdict follows its target."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import report
from bench.figures import Figure, Machine, Results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
TARGET = re.compile(r"^(>=|<=|<|>) ([\d,.]+)( x baseline)?")


def _committed() -> dict[str, Results]:
    results = report.load(RESULTS)
    assert results, f"no raw results in {RESULTS}"
    return results


def test_the_benchmarks_page_table_is_rendered_from_the_committed_results() -> None:
    assert report.PAGE == ROOT / "docs" / "benchmarks.md"
    page = report.PAGE.read_text()
    assert report.START in page and report.END in page
    assert report.replace_block(page, report.render(_committed())) == page


def _meets(figure: Figure) -> bool:
    match = TARGET.match(figure.target)
    assert match, f"{figure.name}: target {figure.target!r} is not '<op> <number>'"
    op, bound, of_baseline = match.group(1), float(match.group(2).replace(",", "")), match.group(3)
    value = figure.ratio if of_baseline else figure.tokenmill
    assert value is not None
    return {">=": value >= bound, "<=": value <= bound, ">": value > bound,
            "<": value < bound}[op]


def test_every_timed_figure_is_wall_clock_and_its_verdict_follows_its_target() -> None:
    figures = [f for r in _committed().values() for f in r.figures]
    timed = [f for f in figures if f.unit == "s" or f.unit.endswith("/s")]
    assert timed
    for f in timed:
        assert f.method.startswith("wall clock"), f"{f.name}: {f.method}"
        if f.baseline is not None:
            assert f.ratio == pytest.approx(f.tokenmill / f.baseline, rel=0.01), f.name
    for f in figures:
        assert f.met == _meets(f), f"{f.name}: met={f.met} but target {f.target!r}"


def test_every_run_records_its_machine_and_command() -> None:
    for name, r in _committed().items():
        assert r.command[:2] == ["python", f"bench/{r.benchmark}.py"], name
        assert r.before.cpu_count >= 1 and len(r.before.load_average) == 3, name
        assert r.date[:4].isdigit(), name


def _results(**figure: object) -> Results:
    machine = Machine(cpu_count=2, usable_cpus=2, load_average=(5.5, 4.0, 3.25))
    fields: dict[str, object] = {
        "name": "sink, small records", "unit": "records/s", "tokenmill": 9000.0,
        "baseline": 12000.0, "baseline_name": "plain boto3", "ratio": 0.75,
        "target": ">= 10,000 records/s", "met": False,
        "method": "wall clock, launch to last commit", "tokenmill_cpu_s": 4.25,
        "baseline_cpu_s": 2.0, **figure}
    return Results(benchmark="bench_sink", date="2026-01-02T03:04:05+00:00",
                   command=["python", "bench/bench_sink.py", "--records", "10"],
                   before=machine, after=machine, figures=[Figure(**fields)])  # type: ignore[arg-type]


def test_a_miss_is_rendered_as_a_miss_with_its_method_and_cpu_apart() -> None:
    block = report.render({"sink.json": _results()})
    row = next(line for line in block.splitlines() if line.startswith("| sink, small"))
    assert "9,000 records/s" in row and "12,000 records/s (plain boto3)" in row
    assert "| 0.750 |" in row and "| **no** |" in row
    assert "| 4.2 / 2.0 |" in row and "wall clock, launch to last commit" in row
    assert ("`python bench/bench_sink.py --records 10` on 2026-01-02, 2 CPUs, "
            "load average (1/5/15 min) 5.5 / 4.0 / 3.2 before") in block


def test_only_the_marked_section_is_replaced() -> None:
    readme = f"intro\n{report.START}\nold table\n{report.END}\noutro\n"
    assert report.replace_block(readme, "new") == (
        f"intro\n{report.START}\nnew\n{report.END}\noutro\n")
    with pytest.raises(SystemExit):
        report.replace_block("no markers", "new")


def test_what_a_run_noticed_is_listed_under_the_table() -> None:
    results = _results(details={"notes": ["worker w2 did not exit; killed"]})
    assert "- sink, small records: worker w2 did not exit; killed" in report.render(
        {"sink.json": results})
