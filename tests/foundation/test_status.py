"""`tokenmill status` numbers, from committed progress records."""

from rich.console import Console

from ops.status import render, summarize
from schemas import Estimate, GenerationSettings, RunSpec
from schemas.progress import ConsumerProgress, ProducerCheckpoint, SinkProgress
from tokenmill.progress import RunProgress

SPEC = RunSpec(run_id="r", partitions=4, generation=GenerationSettings(max_tokens=4096),
               estimate=Estimate(requests_per_s=10.0, output_tokens=2400))


def _state() -> RunProgress:
    state = RunProgress(run="r")
    state.producer = ProducerCheckpoint(run="r", next_seq=1000, total=1000, done=True,
                                        by_category={"plain": 800, "tools": 200},
                                        rejected=3, duplicates=5)
    state.consumers["gpu0"] = ConsumerProgress(
        run="r", instance="gpu0", completions=390, failures=10,
        failures_by_kind={"prompt_too_long": 10}, finish_reasons={"stop": 320, "length": 70},
        by_category={"plain": 300, "tools": 100}, completion_tokens=390 * 2000,
        spec_accept_weighted=3.0 * 1000, spec_tokens=1000, started_at=1000.0, updated_at=1100.0,
        concurrency_limit=64, in_flight=60)
    state.consumers["gpu1"] = ConsumerProgress(
        run="r", instance="gpu1", completions=100, finish_reasons={"stop": 100},
        by_category={"plain": 100}, completion_tokens=100 * 2000, started_at=1050.0,
        updated_at=1100.0)
    state.sinks["s0"] = SinkProgress(run="r", instance="s0", s3_records=300, dlq_records=80,
                                     dlq_by_reason={"length": 70, "failed": 10}, s3_objects=1)
    return state


def test_summary_answers_the_operators_questions() -> None:
    s = summarize(SPEC, _state(), now=1110.0)
    assert s["generated"] == 500 and s["published"] == 1000
    assert s["requests_per_s"] == 500 / 100  # over the span since the first worker started
    assert s["eta_s"] == 500 / 5.0
    assert s["finish_reasons"] == {"stop": 420, "length": 70}
    assert s["accept_length"] == 3.0
    assert s["generated_by_category"] == {"plain": 400, "tools": 100}
    assert s["planned_by_category"]["tools"] == 200
    assert s["persisted"] == 380 and s["dlq_by_reason"]["length"] == 70
    gpu0 = s["instances"][0]
    assert gpu0["instance"] == "gpu0" and gpu0["concurrency_limit"] == 64
    assert gpu0["tokens_per_s"] == 390 * 2000 / 100
    assert not s["sink_done"]


def test_report_renders_every_section() -> None:
    console = Console(record=True, width=160)
    console.print(render(SPEC, summarize(SPEC, _state(), now=1110.0)))
    text = console.export_text()
    for needle in ("published", "speed vs estimate", "finish length", "DLQ: length",
                   "speculative accept length", "coverage by category", "tools", "gpu0",
                   "in progress"):
        assert needle in text
