"""`tokenmill status` against a plan's estimate: truncation, tokens/s and
concurrency are compared too."""

from rich.console import Console

from ops.status import summarize
from ops.status_view import render
from schemas import Estimate, GenerationSettings, RunSpec
from schemas.progress import ConsumerProgress, ProducerCheckpoint
from tokenmill.progress import RunProgress

SPEC = RunSpec(run_id="r", partitions=4, generation=GenerationSettings(max_tokens=4096),
               estimate=Estimate(requests_per_s=10.0, output_tokens=2400, truncated_share=0.18,
                                 hours=25.4, gpus=7, concurrency=60, tokens_per_s=24000.0,
                                 cost=800.0, source="plan"))


def state() -> RunProgress:
    s = RunProgress(run="r")
    s.producer = ProducerCheckpoint(run="r", next_seq=1000, total=1000, done=True)
    s.consumers["gpu0"] = ConsumerProgress(
        run="r", instance="gpu0", completions=400, finish_reasons={"stop": 300, "length": 100},
        completion_tokens=400 * 2400, started_at=1000.0, updated_at=1100.0)
    return s


def test_status_compares_against_the_plan() -> None:
    s = summarize(SPEC, state(), now=1110.0)
    assert s["truncated_share"] == 0.25
    assert s["estimate_truncated_share"] == 0.18 and s["estimate_concurrency"] == 60
    assert s["estimate_tokens_per_s"] == 24000.0 and s["estimate_source"] == "plan"
    console = Console(record=True, width=160)
    console.print(render(SPEC, s))
    text = console.export_text()
    assert "speed vs estimate (from the plan)" in text
    assert "truncated (length)" in text and "25.0%" in text and "18.0%" in text
    assert "concurrency per GPU" in text and "24,000" in text


def test_status_without_a_plan_shows_no_plan_rows() -> None:
    spec = RunSpec(run_id="r", partitions=4, estimate=Estimate(requests_per_s=10.0))
    console = Console(record=True, width=160)
    console.print(render(spec, summarize(spec, state(), now=1110.0)))
    text = console.export_text()
    assert "truncated (length)" not in text and "from the plan" not in text
