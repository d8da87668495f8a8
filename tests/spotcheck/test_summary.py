"""The pure parts of spot-check: filters, the sample plan, the summary and
how a record is rendered (verbatim, with its destination)."""

from __future__ import annotations

import io
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from ops.spot_check import record_table
from ops.spot_filter import Filters, matches
from ops.spot_sample import Picked, Span, plan_sample, quotas
from ops.spot_summary import Lengths, Share, nearest_rank, render, summarize
from schemas import Failure, Message
from schemas.raw import capture
from tests.sink.sink_helpers import make_spec, prompt, variant

SPEC = make_spec("r")


def _from(record: object, source: str) -> object:
    return msgspec.structs.replace(
        record, prompt=msgspec.structs.replace(record.prompt, source=source))  # type: ignore[attr-defined]


# -- filters -------------------------------------------------------------------


def test_filters_combine_with_and() -> None:
    length = variant(SPEC, 1, "length")
    good = variant(SPEC, 2, "good")
    tool = variant(SPEC, 3, "tool_call")
    failed = variant(SPEC, 4, "failed")
    assert matches(length, SPEC, Filters())
    assert matches(length, SPEC, Filters(finish="length", reason="length"))
    assert not matches(good, SPEC, Filters(finish="length"))
    assert not matches(length, SPEC, Filters(finish="length", category="tools"))
    assert matches(tool, SPEC, Filters(category="tools", finish="tool_calls"))
    assert not matches(failed, SPEC, Filters(finish="stop"))  # a failure has no finish reason
    assert matches(failed, SPEC, Filters(reason="failed"))
    assert not matches(good, SPEC, Filters(reason="trivial"))
    assert matches(_from(good, "a.jsonl"), SPEC, Filters(source="a.jsonl"))  # type: ignore[arg-type]
    assert not matches(_from(good, "a.jsonl"), SPEC, Filters(source="b.jsonl"))  # type: ignore[arg-type]


def test_reason_follows_the_runs_policy() -> None:
    lenient = make_spec("r", dlq_reasons=["failed"])
    assert not matches(variant(lenient, 1, "trivial"), lenient, Filters(reason="trivial"))


def test_filters_describe_themselves() -> None:
    assert Filters().describe() == ""
    assert Filters(category="tools", reason="length").describe() == "category=tools, reason=length"


# -- the sample plan -----------------------------------------------------------


def test_quotas_are_even_and_short_partitions_give_way() -> None:
    assert quotas({0: 100, 1: 100, 2: 100}, 10) == {0: 4, 1: 3, 2: 3}
    assert quotas({0: 2, 1: 100, 2: 100}, 30) == {0: 2, 1: 14, 2: 14}
    assert quotas({0: 0, 1: 5}, 30) == {0: 0, 1: 5}
    assert quotas({}, 30) == {}


def test_plan_spreads_runs_over_each_partition() -> None:
    spans = plan_sample({0: (0, 1000), 1: (100, 200)}, 40, chunks=4)
    assert spans == [Span(0, 0, 5), Span(0, 331, 336), Span(0, 663, 668), Span(0, 995, 1000),
                     Span(1, 100, 105), Span(1, 131, 136), Span(1, 163, 168),
                     Span(1, 195, 200)]


def test_plan_takes_a_whole_small_partition_in_one_run() -> None:
    assert plan_sample({0: (7, 10)}, 100, chunks=4) == [Span(0, 7, 8), Span(0, 8, 9),
                                                        Span(0, 9, 10)]
    assert plan_sample({0: (5, 5)}, 100) == []
    with pytest.raises(ValueError):
        plan_sample({0: (0, 1)}, 1, chunks=0)


@given(st.dictionaries(st.integers(0, 30), st.tuples(st.integers(0, 10_000),
                                                     st.integers(0, 10_000)), max_size=12),
       st.integers(1, 5_000), st.integers(1, 8))
def test_plan_properties(ranges: dict[int, tuple[int, int]], n: int, chunks: int) -> None:
    ranges = {p: (min(a, b), max(a, b)) for p, (a, b) in ranges.items()}
    spans = plan_sample(ranges, n, chunks)
    available = sum(high - low for low, high in ranges.values())
    assert sum(s.end - s.start for s in spans) == min(n, available)
    by_partition: dict[int, list[Span]] = {}
    for span in spans:
        low, high = ranges[span.partition]
        assert low <= span.start < span.end <= high
        by_partition.setdefault(span.partition, []).append(span)
    for p, runs in by_partition.items():
        assert len(runs) <= chunks
        assert runs[0].start == ranges[p][0]  # early results are seen ...
        if len(runs) > 1:
            assert runs[-1].end == ranges[p][1]  # ... and late ones
        assert all(a.end <= b.start for a, b in zip(runs, runs[1:], strict=False))
    taken = {p: sum(s.end - s.start for s in runs) for p, runs in by_partition.items()}
    # Even: a partition that got less than another was exhausted.
    for p, got in taken.items():
        for q, other in taken.items():
            if other > got + 1:
                assert got == ranges[p][1] - ranges[p][0], (p, q)


# -- the summary ---------------------------------------------------------------


def test_nearest_rank() -> None:
    values = list(range(1, 101))
    assert nearest_rank(values, 50) == 50 and nearest_rank(values, 95) == 95
    assert nearest_rank([7], 95) == 7 and nearest_rank([1, 2], 50) == 1
    with pytest.raises(ValueError):
        nearest_rank([], 50)


def _records() -> list[Any]:
    good = []
    for i in range(1, 11):
        base = variant(SPEC, i, "good")
        good.append(msgspec.structs.replace(
            base, usage=msgspec.structs.replace(base.usage, completion_tokens=10 * i)))
    hermes = msgspec.structs.replace(
        variant(SPEC, 20, "tool_call"),
        prompt=msgspec.structs.replace(prompt("r", 20, tools=True), format="hermes"))
    invalid = Failure(id="invalid:t:0:9", run="r", settings_hash="h",
                      prompt=prompt("r", 0), failure="invalid", error="not a prompt",
                      raw=capture("t", 0, 9, None, b"{"))
    return [*good, _from(good[0], "other.jsonl"), variant(SPEC, 11, "length"),
            variant(SPEC, 12, "failed"), variant(SPEC, 13, "tool_call"), hermes,
            variant(SPEC, 14, "missing_reasoning"), invalid]


def test_summary_counts_what_the_operator_asked() -> None:
    records = _records()
    summary = summarize(records, SPEC)
    assert (summary.records, summary.completions, summary.failures) == (17, 15, 2)
    assert summary.prompts == 16  # the invalid record is no prompt
    categories = {s.name: (s.count, s.share) for s in summary.categories}
    assert categories == {"system-prompt": (14, 14 / 16), "tools": (2, 2 / 16)}
    assert summary.sources[0] == Share("test.jsonl", 15, 15 / 16)
    assert summary.sources[1] == Share("other.jsonl", 1, 1 / 16)
    assert summary.with_reasoning == 14  # all completions but missing_reasoning
    assert summary.with_tool_calls == 2
    assert (summary.tool_prompts, summary.tool_prompts_structured,
            summary.tool_prompts_with_calls) == (2, 2, 2)
    assert {s.name: s.count for s in summary.tool_formats} == {"openai": 1, "hermes": 1}
    assert {s.name: s.count for s in summary.finish_reasons} == {
        "stop": 12, "length": 1, "tool_calls": 2}
    assert summary.completion_tokens == Lengths(min=10, median=60, p95=100, max=100)
    assert {s.name: s.count for s in summary.failure_kinds} == {"prompt_too_long": 1,
                                                                "invalid": 1}
    routes = {s.name: s.count for s in summary.routes}
    assert routes == {"S3": 13, "dead-letter: length": 1, "dead-letter: failed": 1,
                      "dead-letter: missing_reasoning": 1, "dead-letter: invalid": 1}
    assert sum(s.share for s in summary.routes) == pytest.approx(1.0)


def test_an_empty_sample_summarizes_to_zeros() -> None:
    summary = summarize([], SPEC)
    assert summary.records == 0 and summary.completion_tokens is None
    assert summary.categories == [] and summary.routes == []
    _print(render(summary, "nothing"))


def _print(renderable: object) -> str:
    console = Console(file=io.StringIO(), width=300, color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_summary_renders_source_names_verbatim() -> None:
    records = [_from(variant(SPEC, 1, "good"), "[bold]x[/bold].jsonl"),
               _from(variant(SPEC, 2, "good"), "[/INST]\x1b[31m.jsonl")]
    out = _print(render(summarize(records, SPEC), "a test"))  # type: ignore[arg-type]
    assert "[bold]x[/bold].jsonl" in out
    assert "[/INST]\\x1b[31m.jsonl" in out and "\x1b" not in out
    assert "Prompts by source" in out and "50.0%" in out


# -- one record ----------------------------------------------------------------


def _with_text(text: str) -> object:
    base = variant(SPEC, 1, "good")
    return msgspec.structs.replace(
        base, content=text, reasoning_content=text,
        prompt=msgspec.structs.replace(base.prompt,
                                       messages=(Message(role="user", content=text),)))


@pytest.mark.parametrize("text,shown", [
    ("<s>[INST] hi [/INST]", "<s>[INST] hi [/INST]"),
    ("[general] this that", "[general] this that"),
    ("[bold]x[/bold]", "[bold]x[/bold]"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("bad \ud800 half", "bad \\ud800 half"),
])
def test_a_record_is_rendered_verbatim(text: str, shown: str) -> None:
    picked = Picked(_with_text(text), 1, 42)  # type: ignore[arg-type]
    out = _print(record_table(picked, Text("S3: k"), 100))
    assert out.count(shown) == 3  # last user turn, reasoning, answer
    out.encode("utf-8")
    assert "\x1b" not in out
    assert "partition 1 offset 42" in out and "S3: k" in out


def test_a_long_line_is_cut_to_the_width() -> None:
    picked = Picked(_with_text("word " * 1000), 0, 0)  # type: ignore[arg-type]
    out = _print(record_table(picked, Text("S3: k"), 50))
    assert ("word " * 9 + "word…") in out and "word " * 11 not in out


def test_an_invalid_record_shows_its_bytes_with_bad_ones_escaped() -> None:
    invalid = Failure(id="invalid:t:0:9", run="r", settings_hash="h", prompt=prompt("r", 0),
                      failure="invalid", error="not a prompt record: Invalid UTF-8",
                      raw=capture("t", 0, 9, None, b'{"x": "\xff[/INST]"}'))
    out = _print(record_table(Picked(invalid, 0, 9), Text("dead-letter topic: invalid"), 100))
    assert '{"x": "\\udcff[/INST]"}' in out and "dead-letter topic: invalid" in out
