"""The report page the way a person sees it: rendered offline by headless
Chromium, every chart drew (coloured pixels where each chart is), nothing on
the console; bad or empty runs give a page that says so. And the page
carries everything it shows: no script, no reference to anything outside."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from bench import report_records
from ops.report import figures, render
from ops.report.aggregate import Aggregator, TimelineBuilder
from ops.report.build import WriteFile, write_report
from ops.report.figures import Figures
from schemas.progress import ConsumerProgress
from tests.report.browser import ink, look

EVERY_CHART = {"finish-category", "finish-source", "dlq-category", "dlq-source", "thinking",
               "accept", "accept-gpu", "throughput", "progress", "turns", "tool-rounds"}


def report(n: int, *, spec: bool = True, conversations: float = 0.2, failures: float = 0.02,
           progress: bool = True) -> Figures:
    agg = Aggregator([4096])
    for accepted, data in report_records.results(n, conversations=conversations, spec=spec,
                                                 failures=failures):
        (agg.add_line if accepted else agg.add_dead_letter)(data)
    timeline = TimelineBuilder()
    if progress:
        timeline.add_plan("r1", 1.2)
        for p in report_records.progress(total=n, seconds=1800):
            timeline.add("r1", p if spec else msgspec.structs.replace(p, spec_tokens=0)
                         if isinstance(p, ConsumerProgress) else p)
    return agg.figures("tokenmill report: r1", ["r1"], timeline.timeline(),
                       timeline.accept_by_gpu())


def page_of(tmp_path: Path, found: Figures) -> Path:
    write_report(WriteFile(tmp_path), found)
    assert figures.decode((tmp_path / "report.json").read_bytes()) == found
    return tmp_path / "report.html"


def assert_self_contained(page: str) -> None:
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert not re.search(r"\b(src|href)\s*=", page) and "url(" not in page
    assert "@import" not in page
    # the SVG namespace is a name, never fetched; nothing else names a host
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}


def test_every_chart_draws(tmp_path: Path) -> None:
    found = report(3000)
    page = page_of(tmp_path, found)
    assert_self_contained(page.read_text())
    seen = look(page)
    assert seen.console == []
    ids = {c.id for c in seen.charts}
    assert EVERY_CHART <= ids and len([i for i in ids if i.startswith("lengths-")]) == 4
    for chart in seen.charts:
        assert chart.plot, f"{chart.id}: no chart but {chart.empty!r}"
        left, top, right, bottom = chart.box
        assert right - left > 200 and bottom - top > 60, chart
        assert bottom <= seen.shot.size[1], f"{chart.id} is below the screenshot"
        inked, coloured = ink(seen.shot, chart.box)
        assert inked > 0.01 and coloured > 0.004, f"{chart.id} looks blank: {inked:.3f} inked, " \
                                                 f"{coloured:.3f} coloured"


BAD_RUNS = {
    "no records": (lambda: report(0, progress=False),
                   "This run has no results yet", EVERY_CHART | {"lengths"}),
    "every record in the DLQ": (lambda: report(400, failures=1.0, conversations=0.0,
                                               spec=False),
                                "Every result of this run is in the dead-letter topic",
                                {"lengths", "thinking", "accept", "accept-gpu", "turns",
                                 "tool-rounds"}),
    "no spec stats": (lambda: report(300, spec=False, conversations=0.0),
                      "No speculative decoding stats", {"accept", "accept-gpu", "turns",
                                                        "tool-rounds"}),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_a_bad_or_empty_run_gives_a_page_that_says_so(tmp_path: Path, case: str) -> None:
    make, says, without = BAD_RUNS[case]
    page = page_of(tmp_path, make())
    text = page.read_text()
    assert says in text and "Traceback" not in text
    assert_self_contained(text)
    seen = look(page)
    assert seen.console == []
    for chart in seen.charts:
        inked, coloured = ink(seen.shot, chart.box)
        if chart.id in without:
            assert not chart.plot and chart.empty, f"{chart.id} drew from nothing"
            assert inked > 0.005, f"{chart.id}: the sentence saying why is not visible"
        else:
            assert chart.plot and coloured > 0.005, f"{chart.id} looks blank"


def test_text_from_the_records_is_escaped() -> None:
    found = report(50)
    hostile = Figures(**{**{f: getattr(found, f) for f in found.__struct_fields__},
                         "title": "<script>alert(1)</script>", "runs": ["r&<b>"]})
    page = render.render(hostile)
    assert "<script>" not in page and "&lt;script&gt;" in page and "r&amp;&lt;b&gt;" in page
