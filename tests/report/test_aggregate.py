"""The report's aggregator on records encoded from the real schemas: every
figure accounts for every record (property-tested), and the timeline's
rates and totals are what the cumulative counters imply."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import report_records
from ops.report.aggregate import (
    ACCEPT_BINS,
    COUNT_BINS,
    LENGTH_BINS,
    MAX_POINTS,
    Aggregator,
    TimelineBuilder,
    bin_index,
    length_width,
)
from ops.report.figures import Breakdown, Timeline
from schemas import Completion, Failure, Message, PromptRecord
from schemas.completion import Conversation, SpecStats, Step, Usage
from schemas.messages import FunctionCall, ToolCall
from schemas.progress import ProducerCheckpoint

CATEGORIES = ("plain", "tools", "multi-turn")
REASONS = ("length", "failed", "empty")


def prompt(i: int, category: str, source: str) -> PromptRecord:
    turns = tuple(Message("user", f"q{k}") for k in range(26))  # up to 25 turns answered
    return PromptRecord(id=f"{i:032x}", run="r", messages=turns,
                        source=source, format="openai", category=category)  # type: ignore[arg-type]


answers = st.fixed_dictionaries({
    "tokens": st.integers(0, 20_000),
    "finish": st.sampled_from(["stop", "length", "tool_calls"]),
    "reasoning": st.sampled_from([None, "", "  \n", "thought"]),
    "accept": st.none() | st.floats(0, 20, allow_nan=False),
    "gpu": st.sampled_from(["g0", "g1"]),
    "tool": st.booleans(),
})
records = st.fixed_dictionaries({
    "kind": st.sampled_from(["completion", "failure", "conversation"]),
    "category": st.sampled_from(CATEGORIES),
    "source": st.sampled_from([f"s{i}" for i in range(15)]),
    "steps": st.lists(st.tuples(st.integers(0, 25), answers), min_size=1, max_size=6),
    "dlq": st.none() | st.sampled_from(REASONS),
})


def encode(i: int, r: dict) -> tuple[bool, bytes]:
    p = prompt(i, r["category"], r["source"])
    record: Completion | Failure | Conversation
    first = r["steps"][0][1]
    common = {"usage": Usage(completion_tokens=first["tokens"]),
              "spec": SpecStats(accept_length=first["accept"]), "instance": first["gpu"]}
    if r["kind"] == "completion":
        record = Completion(id=p.id, run="r", settings_hash="h", prompt=p,
                            finish_reason=first["finish"],
                            reasoning_content=first["reasoning"], **common)
    elif r["kind"] == "failure":
        record = Failure(id=p.id, run="r", settings_hash="h", prompt=p, failure="timeout",
                         error="")
    else:
        steps = tuple(Step(turn=turn, finish_reason=a["finish"],
                           reasoning_content=a["reasoning"],
                           tool_calls=(ToolCall(FunctionCall("f", "{}")),) if a["tool"] else None,
                           usage=Usage(completion_tokens=a["tokens"]),
                           spec=SpecStats(accept_length=a["accept"]), instance=a["gpu"])
                      for turn, a in r["steps"])
        record = Conversation(id=p.id, run="r", settings_hash="h", prompt=p, steps=steps)
    if r["dlq"] is None:
        if isinstance(record, Failure):  # the sink sends failures to the DLQ, always
            return False, msgspec.json.encode(report_records.dead_letter(record, "failed", i))
        return True, report_records.s3_line(record)
    letter = report_records.dead_letter(record, r["dlq"], i)
    return False, msgspec.json.encode(letter)


def rows_total(b: Breakdown) -> int:
    return sum(sum(row.values()) for _, row in b.rows)


@settings(max_examples=60, deadline=None)
@given(st.lists(records, max_size=40), st.sampled_from([[1], [64], [4096], [512, 8192]]))
def test_every_figure_accounts_for_every_record(batch: list[dict], caps: list[int]) -> None:
    agg = Aggregator(caps)
    for i, r in enumerate(batch):
        accepted, data = encode(i, r)
        (agg.add_line if accepted else agg.add_dead_letter)(data)
    f = agg.figures("t", ["r"], Timeline([], [], 0, False))
    answer_list = [a for r in batch if r["kind"] != "failure"
                   for _, a in (r["steps"] if r["kind"] == "conversation" else r["steps"][:1])]
    assert f.records == len(batch)
    assert f.dead_letters == sum(1 for r in batch if r["dlq"] or r["kind"] == "failure")
    assert rows_total(f.finish_by_category) == rows_total(f.finish_by_source) == len(batch)
    assert rows_total(f.dlq_by_category) == rows_total(f.dlq_by_source) == f.dead_letters
    assert len(f.finish_by_source.rows) <= 12
    assert rows_total(f.thinking) == sum(row.answers for row in f.lengths) == len(answer_list)
    for row in f.lengths:
        assert sum(row.histogram.counts) == row.answers >= row.truncated
        assert len(row.histogram.counts) == LENGTH_BINS
        assert row.histogram.edges[-1] > max(caps)  # every cap is on the chart
    assert sum(row.truncated for row in f.lengths) == sum(
        1 for a in answer_list if a["finish"] == "length")
    with_accept = [a for a in answer_list if a["accept"] is not None]
    assert sum(f.accept_lengths.counts if f.accept_lengths else []) == len(with_accept)
    conversations = [r for r in batch if r["kind"] == "conversation"]
    assert f.conversations == len(conversations)
    if conversations:
        assert f.turns and f.tool_rounds
        assert sum(f.turns.counts) == sum(f.tool_rounds.counts) == len(conversations)
    else:
        assert f.turns is None and f.tool_rounds is None


@given(st.floats(-10, 1e9, allow_nan=False), st.floats(0.01, 1e4), st.integers(1, 64))
def test_a_value_falls_in_one_bin(value: float, width: float, bins: int) -> None:
    assert 0 <= bin_index(value, width, bins) < bins


def test_the_cap_is_on_the_chart_and_a_large_one_in_the_last_bin() -> None:
    for cap in (1, 31, 32, 4096, 32768, 131072):
        width = length_width([cap])
        assert cap < width * LENGTH_BINS  # inside the chart, not in a clamped bin
        if cap >= 1000:  # the truncated answers are the last bar, alone
            assert bin_index(cap, width, LENGTH_BINS) == LENGTH_BINS - 1
            assert bin_index(cap - width, width, LENGTH_BINS) == LENGTH_BINS - 2
    assert ACCEPT_BINS * 0.25 == 8 and COUNT_BINS == 20


def test_thinking_is_present_with_reasoning_text_or_tokens() -> None:
    agg = Aggregator([100])
    p = prompt(0, "plain", "s")
    for reasoning, tokens in (("  ", 0), (None, 5), ("x", 0), (None, 0)):
        agg.add_line(report_records.s3_line(Completion(
            id=p.id, run="r", settings_hash="h", prompt=p, finish_reason="stop",
            reasoning_content=reasoning, usage=Usage(reasoning_tokens=tokens))))
    assert dict(agg.figures("t", [], Timeline([], [], 0, False)).thinking.rows) == {
        "plain": {"present": 2, "absent": 2}}


def test_dead_letters_of_records_that_were_not_prompts_count_without_a_category() -> None:
    from schemas import DeadLetter
    agg = Aggregator([100])
    agg.add_dead_letter(msgspec.json.encode(DeadLetter(
        id="x", run="r", reason="invalid", detail="", source_topic="t", source_partition=0,
        source_offset=0, record=None)))
    f = agg.figures("t", [], Timeline([], [], 0, False))
    assert f.dlq_by_category.rows == [("(no prompt)", {"invalid": 1})]
    assert f.records == f.dead_letters == 1 and f.lengths == []


def feed(builder: TimelineBuilder, run: str = "r1", **kwargs: int) -> int:
    n = 0
    for p in report_records.progress(run=run, **kwargs):
        n += 1
        builder.add(run, p)
    return n


def test_the_timeline_stays_small_and_its_rates_add_up_to_the_tokens() -> None:
    builder = TimelineBuilder()
    builder.add_plan("r1", 2.0)
    n = feed(builder, gpus=3, seconds=7200, every=1.0, total=9000)
    timeline = builder.timeline()
    assert timeline.snapshots == n and timeline.planned
    assert [s.name for s in timeline.throughput] == ["gpu0", "gpu1", "gpu2"]
    last = {p.instance: p for p in report_records.progress(gpus=3, seconds=7200, every=1.0,
                                                            total=9000)
            if p.__struct_config__.tag == "consumer"}
    for series in timeline.throughput:
        assert 10 < len(series.points) <= MAX_POINTS
        xs = [t for t, _ in series.points]
        assert xs == sorted(xs)
        assert all(2000 * 0.5 <= v <= 3000 * 1.2 for _, v in series.points[25:])
    generated, plan = timeline.progress
    assert generated.name == "r1 generated" and plan.name == "r1 plan"
    assert generated.points[-1][1] == sum(p.completions for p in last.values())  # type: ignore[union-attr]
    assert plan.points == [(0.0, 0.0), (4500.0, 9000.0)]  # 9,000 prompts at 2 per second
    for series in timeline.throughput:  # thinning keeps the newest commit
        assert abs(series.points[-1][0] - 7200) < 1e-6
    accept = builder.accept_by_gpu()
    assert [(g.instance, round(g.mean, 6)) for g in accept] == [
        ("gpu0", 2.6), ("gpu1", 2.9), ("gpu2", 3.2)]
    assert [g.tokens for g in accept] == [last[g].completion_tokens for g in sorted(last)]  # type: ignore[union-attr]


def test_a_run_without_workers_has_an_empty_timeline() -> None:
    builder = TimelineBuilder()
    builder.add("r1", ProducerCheckpoint(run="r1", next_seq=10, total=10, done=True))
    timeline = builder.timeline()
    assert timeline.throughput == [] and timeline.progress == [] and not timeline.planned
    assert builder.accept_by_gpu() == []


def test_synthetic_results_look_like_a_run() -> None:
    agg = Aggregator([4096])
    for accepted, data in report_records.results(2000, conversations=0.1):
        (agg.add_line if accepted else agg.add_dead_letter)(data)
    f = agg.figures("t", ["r1"], Timeline([], [], 0, False))
    assert f.records == 2000 and 0 < f.dead_letters < 400
    assert {row.category for row in f.lengths} >= {"plain", "multi-turn"}
    assert all(row.truncated for row in f.lengths if row.answers > 200)
    again = Aggregator([4096])
    for accepted, data in report_records.results(2000, conversations=0.1):
        (again.add_line if accepted else again.add_dead_letter)(data)
    assert again.figures("t", ["r1"], Timeline([], [], 0, False)) == f  # deterministic
