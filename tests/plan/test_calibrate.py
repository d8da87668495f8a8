"""The calibration sweep against a simulated server: levels held, every
sample prompt answered once, and what happens when time runs out, the
operator stops it, or the server rejects prompts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumer.sglang_client import SGLangClient, request_body
from ops.plan.build import Costing, ServerInfo, calibrated_plan
from ops.plan.calibrate import Sweep, SweepResult, SweepStatus, level_durations
from ops.plan.dataset import DatasetSample, read_sample
from producer import synthetic
from schemas.run import GenerationSettings
from sglang_sim import SimulatorConfig, running_simulator
from sglang_sim.runner import SimulatorProcess
from tests.plan.knee import measured_corner

CANDIDATES = (256, 512, 1024)


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> DatasetSample:
    data = tmp_path_factory.mktemp("plan") / "data.jsonl"
    synthetic.write_jsonl(data, synthetic.records(400, seed=2, words=20))
    return read_sample([data], multi_turn="last-user", tools="structured", size=120, seed=1)


def sweep(url: str, sample: DatasetSample, levels: list[int], *, level_seconds: float,
          budget_s: float, stop_after: int | None = None) -> SweepResult:
    settings = GenerationSettings(max_tokens=CANDIDATES[-1])
    bodies = [request_body(p.prompt, settings) for p in sample.prompts]

    async def main() -> SweepResult:
        stop = asyncio.Event()

        def status(s: SweepStatus) -> None:
            if stop_after is not None and s.answered >= stop_after:
                stop.set()  # what the Ctrl-C handler does

        async with SGLangClient(url) as client:
            return await Sweep(client, bodies, levels, durations=[level_seconds] * len(levels),
                               budget_s=budget_s, on_status=status).run(stop)

    return asyncio.run(main())


@contextlib.contextmanager
def killed_after(config: SimulatorConfig) -> Iterator[str]:
    """A simulator process, killed at the end: a cancelled request keeps a
    simulator's handler busy until its answer would have ended, and a
    graceful stop would wait for it."""
    sim = SimulatorProcess(config)
    try:
        yield sim.start()
    finally:
        sim.kill()


def plan_of(sample: DatasetSample, result: SweepResult, url: str, budget: float):  # type: ignore[no-untyped-def]
    return calibrated_plan(sample, result, ServerInfo(url, "sim", 16, budget),
                           Costing(gpus=2, gpu_hour_cost=3.0, candidates=CANDIDATES))


def in_flight_at(result: SweepResult, t: float) -> int:
    return sum(1 for r in result.requests if r.start <= t and (r.end is None or r.end > t))


def test_levels_are_held_and_every_sample_prompt_is_answered(sample: DatasetSample) -> None:
    config = SimulatorConfig(max_running_requests=16, decode_rate=40.0, max_total_tok_s=400.0,
                             length_median=150.0, time_scale=50.0)
    with running_simulator(config) as url:
        result = sweep(url, sample, [1, 4, 16, 32], level_seconds=1.0, budget_s=60.0)
    assert not (result.interrupted or result.out_of_time or result.stopped_for_failures)
    assert result.unsent == 0
    for span in result.levels:
        # sampled over the level's middle half: never above it, almost always at it (a slot
        # refills an instant after its answer ends)
        points = [span.start + (span.end - span.start) * (0.25 + 0.5 * i / 199) for i in range(200)]
        counts = [in_flight_at(result, t) for t in points]
        assert max(counts) == span.concurrency
        assert sum(c == span.concurrency for c in counts) >= 0.9 * len(counts)
    firsts = [r for r in result.requests if not r.repeat]
    assert sorted(r.sample for r in firsts) == list(range(len(sample.prompts)))
    assert all(r.outcome in ("stop", "length", "tool_calls") for r in result.requests)

    plan = plan_of(sample, result, url, 60.0)
    assert plan.lengths is not None and len(plan.lengths.answers) == len(sample.prompts)
    assert {a.outcome for a in plan.lengths.answers} <= {"stop", "length"}
    assert plan.prompt_tokens.source == "server" and plan.prompt_tokens.mean > 0
    c = plan.calibration
    assert c is not None and [lv.concurrency for lv in c.levels] == [1, 4, 16, 32]
    # 40 tok/s per request, 400 in all: the knee is at 10 (x50 time scale)
    assert c.levels[0].tokens_per_s == pytest.approx(40 * 50, rel=0.15)
    assert c.levels[-1].tokens_per_s == pytest.approx(400 * 50, rel=0.1)
    # the knee (95% of the plateau) near the corner the measured rates put at
    # 10 when the simulator keeps time: half to 1.6 times it, as when it does
    corner = measured_corner(c.levels)
    assert 0.5 * corner <= c.knee_concurrency <= 1.6 * corner and c.saturated, (corner, c)
    assert [p.max_tokens for p in plan.predictions] == list(CANDIDATES)
    shares = [p.truncated_share for p in plan.predictions]
    assert shares == sorted(shares, reverse=True)


def test_out_of_time_answers_are_censored_not_dropped(sample: DatasetSample) -> None:
    # real-time decoding at 20 tok/s for 3 s: short answers finish, long ones do not
    config = SimulatorConfig(max_running_requests=64, decode_rate=20.0, length_median=40.0,
                             length_sigma=1.0, time_scale=1.0)
    with killed_after(config) as url:
        result = sweep(url, sample, [4, 16], level_seconds=1.0, budget_s=3.0)
    assert result.out_of_time and result.unsent > 0
    plan = plan_of(sample, result, url, 3.0)
    assert plan.lengths is not None
    answers = plan.lengths.answers
    unfinished = [a for a in answers if a.outcome == "unfinished"]
    finished = [a for a in answers if a.outcome == "stop"]
    assert unfinished and finished
    # an unfinished answer had most likely received 20 tok/s x its time in flight (<= 3 s)
    assert all(1 <= a.tokens <= 20 * 3 * 1.2 for a in unfinished)
    assert any("still running at the end" in n for n in plan.notes)
    assert any("never sent" in n for n in plan.notes)
    # every finished answer is short (<= 60 tokens in 3 s); dropping the unfinished ones
    # would claim nothing is ever cut at 256; censored, they keep their share
    assert max(a.tokens for a in finished) <= 60
    share = plan.predictions[0].truncated_share
    assert share is not None and share > 0.05


def test_nothing_finished_means_no_prediction(sample: DatasetSample) -> None:
    config = SimulatorConfig(decode_rate=20.0, length_median=400.0, length_min=200,
                             time_scale=1.0)
    with killed_after(config) as url:
        result = sweep(url, sample, [2, 8], level_seconds=0.5, budget_s=2.0)
    plan = plan_of(sample, result, url, 2.0)
    assert plan.predictions == ()
    assert any("no prediction" in n for n in plan.notes)


def test_a_stop_keeps_what_was_measured(sample: DatasetSample) -> None:
    config = SimulatorConfig(max_running_requests=16, decode_rate=40.0, length_median=150.0,
                             time_scale=20.0)
    with running_simulator(config) as url:
        result = sweep(url, sample, [1, 2, 4, 8, 16], level_seconds=2.0, budget_s=60.0,
                       stop_after=10)
    assert result.interrupted and not result.out_of_time
    assert result.ended - result.started < 30
    plan = plan_of(sample, result, url, 60.0)
    assert plan.calibration is not None and plan.calibration.interrupted
    assert plan.notes[0].startswith("interrupted")
    assert plan.lengths is not None and len(plan.lengths.answers) >= 10


def test_prompts_the_server_rejects_are_reported(sample: DatasetSample) -> None:
    # a context too small for the longer prompts: SGLang answers 400
    config = SimulatorConfig(context_length=1100, length_median=100.0, time_scale=100.0)
    with running_simulator(config) as url:
        result = sweep(url, sample, [4, 8], level_seconds=0.5, budget_s=30.0)
    rejected = [r for r in result.requests if r.outcome == "rejected"]
    assert rejected and all("prompt_too_long" in r.error for r in rejected)
    plan = plan_of(sample, result, url, 30.0)
    assert plan.calibration is not None and plan.calibration.failures >= len(rejected)
    assert any("rejected by the server" in n for n in plan.notes)
    assert plan.lengths is not None
    assert len(plan.lengths.answers) == len(sample.prompts) - len({r.sample for r in rejected})


def test_calibration_needs_prompts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no prompts"):
        Sweep(None, [], [1], durations=[1.0], budget_s=1)  # type: ignore[arg-type]


def test_low_levels_get_the_shorter_durations() -> None:
    durations = level_durations([1, 4, 16, 64], 60.0)
    assert sum(durations) == pytest.approx(60.0)
    assert durations == sorted(durations)
    assert durations[3] / durations[0] == pytest.approx(8.0)


def test_a_failing_server_stops_calibration_and_says_why(sample: DatasetSample) -> None:
    config = SimulatorConfig(error_rate=1.0, error_status=500, time_scale=100.0)
    with running_simulator(config) as url:
        result = sweep(url, sample, [4, 8], level_seconds=2.0, budget_s=30.0)
    assert result.stopped_for_failures and result.ended - result.started < 20
    plan = plan_of(sample, result, url, 30.0)
    assert plan.predictions == ()
    assert plan.notes[0].startswith("calibration stopped:") and "HTTP 500" in plan.notes[0]
    assert any("failed on every attempt" in n for n in plan.notes)
