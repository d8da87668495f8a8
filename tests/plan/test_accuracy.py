"""`tokenmill plan` against the simulator: does the plan predict the run?

One simulated GPU with a known capacity (32 running requests, 40 tok/s each,
800 tok/s in all: the knee is at 20) and a known answer-length distribution
(lognormal, median 400 tokens) is calibrated with `tokenmill plan`. Then the
real pipeline runs the same dataset on three such GPUs: `tokenmill produce
--plan` (the plan's estimate goes into the run spec), three `tokenmill
consume` workers at the plan's recommended concurrency, until every prompt
has a committed result.

What is measured, and how:
* makespan: from the first request any of the three servers received to the
  moment the last one went idle (their /metrics, polled every 50 ms), the way
  the plan defines its hours (first request to last answer). The workers
  join the run's consumer group before the prompts are published, so the
  group forming (about 2 s of real time, which at 40x simulated speed would
  stand for 80 s) is not part of the run.
* truncation at the run's max_tokens: the share of committed completions
  with finish_reason "length"; at the other candidates: every prompt of the
  dataset sent once more to a zero-delay simulator with the same seed (same
  answers), counting finish_reason "length" (and at the run's max_tokens
  this must equal the pipeline's share exactly).

Both sides run at 40x simulated speed on the same machine, so a loaded
machine slows the calibration and the run alike. The sample is half the
dataset so the truncation check (2 points) has about 2.5 standard errors of
room at the worst candidate (24%); the answers are deterministic (seeded),
so the truncation part does not depend on timing at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from consumer.sglang_client import SGLangClient, request_body
from ops.plan.dataset import read_sample
from producer import synthetic
from producer.inputs import fingerprint, resolve
from schemas.plan import plan_decoder
from schemas.prompt import PromptRecord
from schemas.run import GenerationSettings, RunSpec
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.consumer.pipeline import (
    ConsumerProcess,
    committed_records,
    duplicates,
    sim_metrics,
    wait_until,
)
from tests.plan.knee import measured_corner
from tokenmill.forecast.estimate import run_estimate
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.alone]

# 40x and a 50 s calibration budget: the test runs alone, so its wall time
# is CI's; at 20x and 150 s it took 132 s, at 40x and 80 s 73-75 s, at 40x
# and 50 s 61 s (35 s saved only 2 s more), the makespan error inside -4%
# (against the 10% bound) on this 2-core machine. At 80x it missed: -10.1%.
TIME_SCALE = 40.0
SIM = SimulatorConfig(max_running_requests=32, decode_rate=40.0, max_total_tok_s=800.0,
                      length_median=400.0, length_sigma=0.665, time_scale=TIME_SCALE, seed=11)
PROMPTS = 3000
SAMPLE = 1500
CANDIDATES = (640, 1024, 2048)
RUN_MAX_TOKENS = 1024
GPUS = 3


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", *args]


class BusyWatch:
    """Polls each server's /metrics: when it first had work, when it was
    last seen with work."""

    def __init__(self, urls: list[str], interval: float = 0.05) -> None:
        self.urls = urls
        self.interval = interval
        self.first_busy: dict[str, float] = {}
        self.last_busy: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                try:
                    m = sim_metrics(url)
                except OSError:
                    continue
                if m.get("sglang:num_running_reqs", 0) + m.get("sglang:num_queue_reqs", 0) > 0:
                    now = time.monotonic()
                    self.first_busy.setdefault(url, now)
                    self.last_busy[url] = now
            self._stop.wait(self.interval)

    def spans(self) -> list[float]:
        """Each server's busy span: first request to last answer."""
        return [self.last_busy[u] - self.first_busy[u] for u in self.urls]

    def whole(self) -> float:
        """First request on any server to the last answer on any."""
        return max(self.last_busy.values()) - min(self.first_busy.values())

    def __enter__(self) -> BusyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def held_partitions(worker: ConsumerProcess) -> set[int]:
    """The partitions a worker holds, from its last assign/revoke log line."""
    now: list[int] = []
    for line in worker.log().splitlines():
        if line.startswith("{") and '"partitions ' in line:
            event = json.loads(line)
            if event.get("event") in ("partitions assigned", "partitions revoked"):
                now = event.get("owned") or []
    return set(now)


def group_formed(workers: list[ConsumerProcess], partitions: int) -> bool:
    """Every worker holds partitions and together they hold them all."""
    held = [held_partitions(w) for w in workers]
    return all(held) and set().union(*held) == set(range(partitions))


def length_shares(prompts: list[PromptRecord], budgets: tuple[int, ...]) -> dict[int, float]:
    """Share of the dataset's answers cut at each budget, measured by sending
    every prompt to a zero-delay simulator with the same seed."""
    config = SimulatorConfig(zero_delay=True, seed=SIM.seed, length_median=SIM.length_median,
                             length_sigma=SIM.length_sigma)

    async def measure(url: str) -> dict[int, float]:
        out: dict[int, float] = {}
        gate = asyncio.Semaphore(64)
        async with SGLangClient(url, max_connections=64) as client:
            for budget in budgets:
                settings = GenerationSettings(max_tokens=budget)

                async def one(prompt: PromptRecord) -> bool:
                    async with gate:
                        answer = await client.chat(request_body(prompt, settings))
                        return answer.finish_reason == "length"

                cut = await asyncio.gather(*(one(p) for p in prompts))
                out[budget] = sum(cut) / len(cut)
        return out

    with SimulatorProcess(config) as sim:
        return asyncio.run(measure(sim.base_url))


@pytest.mark.timeout(900)
def test_plan_predicts_a_three_gpu_run(settings: Settings, run_id: str, tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    synthetic.write_jsonl(data, synthetic.records(PROMPTS, seed=5, words=20))
    plan_path = tmp_path / "plan.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    common = ("--bootstrap-servers", settings.bootstrap_servers, "--state-dir",
              str(settings.state_dir), "--log-level", "warning")

    # 1. plan: calibrate one simulated GPU with half the dataset as the sample
    with SimulatorProcess(SIM) as sim:
        planned = subprocess.run(
            cli("plan", str(data), "--sglang-url", sim.base_url, "--sample", str(SAMPLE),
                "--gpus", str(GPUS), "--max-tokens", ",".join(map(str, CANDIDATES)),
                "--time-budget", "50s", "--no-progress", "-o", str(plan_path), *common),
            env=env, capture_output=True, text=True, timeout=240)
    assert planned.returncode == 0, planned.stderr[-3000:]
    plan = plan_decoder.decode(plan_path.read_bytes())
    calibration = plan.calibration
    assert calibration is not None and calibration.curve is not None
    assert not calibration.interrupted
    assert plan.lengths is not None
    assert all(a.outcome != "unfinished" for a in plan.lengths.answers), plan.notes
    assert len(plan.lengths.answers) == SAMPLE
    concurrency = calibration.recommended_concurrency
    # the knee of this server is at 20 (800 tok/s / 40 tok/s per request) when
    # the simulator keeps time; checked against the corner the measured rates
    # put it at, with the range 17-22 had around 20
    corner = measured_corner(calibration.levels)
    assert 0.85 * corner <= calibration.knee_concurrency <= 1.1 * corner, (corner, calibration)
    assert concurrency > calibration.knee_concurrency
    prediction = plan.prediction_for(RUN_MAX_TOKENS)
    assert prediction is not None

    # 2. the run: three simulated GPUs, a worker each at the recommended
    # concurrency. The workers join the run's group first (on the spec that
    # `produce` will write), so all three GPUs start with the first prompt;
    # then `produce --plan` finds that same spec and publishes.
    estimate = run_estimate(plan, max_tokens=RUN_MAX_TOKENS, gpus=GPUS)
    spec = RunSpec(run_id=run_id, partitions=GPUS * 4, gpus=GPUS,
                   generation=GenerationSettings(max_tokens=RUN_MAX_TOKENS), estimate=estimate,
                   inputs=tuple(fingerprint(source) for source in resolve([data])))
    RunRegistry(settings).create_run(spec)
    sims = [SimulatorProcess(SIM) for _ in range(GPUS)]
    workers: list[ConsumerProcess] = []
    try:
        urls = [sim.start() for sim in sims]
        workers = [ConsumerProcess(settings, run_id, url, f"gpu{i}", tmp_path,
                                   "--concurrency", str(concurrency), "--until-done",
                                   # Equal GPUs, equal partitions: the plan's hours assume the
                                   # GPUs finish together. The fleet planner's slot moves left
                                   # 10-12% of idle tail here (servers idle at 26.0/29.8/33.5 s);
                                   # that tail is issue 10's open miss (bench/bench_fleet.py),
                                   # not the plan's error, so this run shares work statically.
                                   "--no-fleet-balancing").start()
                   for i, url in enumerate(urls)]
        wait_until(lambda: group_formed(workers, spec.partitions), 120, "3 workers sharing "
                   "the partitions")
        with BusyWatch(urls) as watch:
            produced = subprocess.run(
                cli("produce", str(data), "--run", run_id, "--gpus", str(GPUS), "--max-tokens",
                    str(RUN_MAX_TOKENS), "--plan", str(plan_path), "--no-progress", *common),
                env=env, capture_output=True, text=True, timeout=120)
            assert produced.returncode == 0, produced.stderr[-3000:]
            for worker in workers:
                assert worker.wait(300) == 0, worker.log()[-3000:]
        assert set(watch.first_busy) == set(urls), "a server never got work"
        measured_s = watch.whole()
    finally:
        for worker in workers:
            worker.stop()
        for sim in sims:
            sim.terminate()
    # produce stored the plan's prediction as the estimate (the spec it found was equal)
    stored = RunRegistry(settings).get(run_id).estimate
    assert stored == estimate and stored is not None and stored.source == "plan"
    assert stored.hours == pytest.approx(prediction.hours)
    assert stored.truncated_share == pytest.approx(prediction.truncated_share)

    records = committed_records(settings, run_id)
    assert len(records) == PROMPTS and not duplicates(records)
    predicted_s = prediction.hours * 3600
    error = (predicted_s - measured_s) / measured_s
    print(f"makespan: predicted {predicted_s:.1f}s, measured {measured_s:.1f}s "
          f"({100 * error:+.1f}%) at concurrency {concurrency}; per server "
          f"{', '.join(f'{s:.1f}s' for s in watch.spans())}")
    assert abs(error) <= 0.10, (predicted_s, measured_s)

    # 4. truncation at every candidate
    prompts = [p.prompt for p in read_sample([data], multi_turn="last-user", tools="structured",
                                             size=PROMPTS, seed=0).prompts]
    measured = length_shares(prompts, CANDIDATES)
    in_run = sum(1 for r in records if getattr(r, "finish_reason", None) == "length") / PROMPTS
    assert in_run == pytest.approx(measured[RUN_MAX_TOKENS])
    for budget in CANDIDATES:
        predicted_share = plan.prediction_for(budget).truncated_share  # type: ignore[union-attr]
        print(f"max_tokens {budget}: truncated predicted {100 * predicted_share:.2f}%, "
              f"measured {100 * measured[budget]:.2f}%")
        assert abs(predicted_share - measured[budget]) <= 0.02, (budget, predicted_share,
                                                                 measured[budget])
