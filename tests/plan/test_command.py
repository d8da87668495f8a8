"""`tokenmill plan` and the plan-related parts of `tokenmill produce`, as an
operator runs them: flags, output, files, errors, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from devstack.processes import free_port
from ops.plan.command import parse_duration
from ops.plan.runner import public_url
from schemas.plan import Plan, plan_decoder
from schemas.run import Estimate, RunSpec
from sglang_sim import SimulatorConfig, running_simulator
from sglang_sim.runner import SimulatorProcess
from tests.consumer.pipeline import sim_metrics
from tokenmill.cli import cli
from tokenmill.forecast.estimate import run_estimate
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "devstack" / "sample"
FILES = [str(p) for p in sorted(SAMPLE_DIR.iterdir())]
PROMPTS = 224  # what produce publishes from the bundled sample (3 rejected, 1 duplicate)


# plan's reading spool goes under the state dir: keep it out of the working tree
STATE_DIR = tempfile.mkdtemp(prefix="tokenmill-plan-tests-")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"TOKENMILL_STATE_DIR": STATE_DIR}).invoke(cli, list(args),
                                                                      catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A plan made against a fast simulator: (plan file, the table printed)."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    config = SimulatorConfig(max_running_requests=8, decode_rate=50.0, max_total_tok_s=300.0,
                             length_median=200.0, time_scale=100.0)
    with running_simulator(config) as url:
        code, output = invoke("plan", *FILES, "--sglang-url", url, "--sample", "80",
                              "--gpus", "4", "--gpu-hour-cost", "2", "--max-tokens",
                              "256,512,1024", "--time-budget", "20s", "--no-progress",
                              "-o", str(path))
    assert code == 0, output
    yield path, output


# ------------------------------------------------------------------ plan


def test_without_a_server_the_operators_figures_become_hours_tokens_and_cost() -> None:
    code, output = invoke("plan", *FILES, "--estimate-rps", "5.6", "--estimate-output-tokens",
                          "2306", "--gpus", "7", "--json", "--no-progress")
    assert code == 0, output
    plan = plan_decoder.decode(output)
    assert plan.dataset.prompts == PROMPTS and plan.calibration is None
    assert plan.assumptions.source == "flags" and plan.prompt_tokens.source == "estimate"
    (p,) = plan.predictions
    assert p.max_tokens is None and p.truncated_share is None
    assert p.hours == pytest.approx(PROMPTS / 5.6 / 3600)
    assert p.output_tokens == pytest.approx(PROMPTS * 2306)
    assert p.cost == pytest.approx(7 * p.hours * 4.5)
    code, table = invoke("plan", *FILES, "--estimate-rps", "5.6", "--estimate-output-tokens",
                         "2306", "--no-progress")
    assert code == 0
    for needle in ("224 prompts", "GPU-hours", "516.5K", "40 s", "no server measured"):
        assert needle in table


@pytest.mark.parametrize("args,message", [
    (["--estimate-rps", "5"], "give --sglang-url"),
    (["--sglang-url", "http://x:1", "--estimate-rps", "5", "--estimate-output-tokens", "9"],
     "not both"),
    (["--estimate-rps", "5", "--estimate-output-tokens", "9", "--time-budget", "soon"],
     "invalid duration"),
    (["--estimate-rps", "5", "--estimate-output-tokens", "9", "--max-tokens", "4k"],
     "comma-separated whole numbers"),
])
def test_flag_mistakes_are_named(args: list[str], message: str) -> None:
    code, output = invoke("plan", *FILES, *args)
    assert code == 2 and message in output


def test_a_server_that_does_not_answer_is_one_clear_line() -> None:
    code, output = invoke("plan", *FILES, "--sglang-url", f"http://127.0.0.1:{free_port()}",
                          "--no-progress")
    assert code == 1
    assert "does not answer /health" in output and "Traceback" not in output


def test_a_calibrated_plan_table_and_file(calibrated: tuple[Path, str]) -> None:
    path, output = calibrated
    for needle in ("calibration:", "recommended concurrency", "tokens/s", "max_tokens",
                   "truncated", "256", "1,024", "plan written to"):
        assert needle in output
    plan = plan_decoder.decode(path.read_bytes())
    c = plan.calibration
    assert c is not None and c.curve is not None and not c.interrupted
    # levels: powers of two up to twice the server's max_running_requests
    assert c.server_max_running_requests == 8
    assert [lv.concurrency for lv in c.levels] == [1, 2, 4, 8, 16]
    assert plan.lengths is not None and plan.lengths.max_tokens == 1024
    assert len(plan.lengths.answers) == 80
    assert [p.max_tokens for p in plan.predictions] == [256, 512, 1024]
    assert plan.assumptions.gpus == 4 and plan.assumptions.gpu_hour_cost == 2.0
    # the documented shape: answers are compact [stratum, tokens, outcome] arrays
    raw = json.loads(path.read_text())
    assert set(raw) == {"created_at", "dataset", "prompt_tokens", "assumptions", "predictions",
                        "calibration", "lengths", "notes", "v"}
    assert raw["v"] == 1
    stratum, tokens, outcome = raw["lengths"]["answers"][0]
    assert isinstance(stratum, int) and isinstance(tokens, int) and outcome in ("stop", "length")


def test_ctrl_c_stops_with_what_was_measured(tmp_path: Path) -> None:
    # a slow server (real time): calibration would take minutes
    config = SimulatorConfig(max_running_requests=16, decode_rate=30.0, length_median=100.0,
                             time_scale=1.0)
    sim = SimulatorProcess(config)
    url = sim.start()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenmill.cli", "plan", *FILES, "--sglang-url", url,
             "--sample", "100", "--time-budget", "10m", "--json", "--no-progress",
             "--log-format", "json", "--state-dir", str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        seen = ""
        while '"calibrating"' not in seen and time.monotonic() < deadline:
            seen += proc.stderr.readline()
        assert '"calibrating"' in seen, seen
        # some answers come back (about 3 s each alone): the server counts them
        deadline = time.monotonic() + 60
        while sim_metrics(url).get("sglang:num_requests_total", 0) < 3:
            assert time.monotonic() < deadline, "no answers within 60 s"
            time.sleep(0.2)  # poll of a wait loop
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        sim.kill()
    assert proc.returncode == 0, stderr[-2000:]
    assert "stopping calibration" in stderr
    plan = plan_decoder.decode(stdout)
    assert plan.calibration is not None and plan.calibration.interrupted
    assert plan.notes[0].startswith("interrupted (Ctrl-C)")
    assert plan.calibration.requests > 0 and plan.lengths is not None
    assert plan.calibration.seconds < 60


# ------------------------------------------------------------------ produce


def test_produce_dry_run_turns_estimates_into_hours_tokens_and_cost(tmp_path: Path) -> None:
    code, output = invoke("produce", *FILES, "--run", "r1", "--gpus", "7", "--dry-run",
                          "--estimate-rps", "5.6", "--estimate-output-tokens", "2306",
                          "--state-dir", str(tmp_path), "--no-progress")
    assert code == 0, output
    for needle in ("forecast from --estimate-rps", "224 prompts on 7 GPU(s)", "40 s", "516.5K",
                   "$0.35"):
        assert needle in output
    code, output = invoke("produce", *FILES, "--run", "r1", "--gpus", "7", "--dry-run",
                          "--estimate-rps", "5.6", "--state-dir", str(tmp_path),
                          "--no-progress")
    assert code == 0 and "224 prompts at 5.60 requests/s take 40 s" in output


def test_produce_dry_run_with_a_plan(calibrated: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = calibrated
    plan = plan_decoder.decode(path.read_bytes())
    code, output = invoke("produce", *FILES, "--run", "r2", "--gpus", "4", "--max-tokens",
                          "512", "--dry-run", "--plan", str(path), "--state-dir", str(tmp_path),
                          "--no-progress")
    assert code == 0, output
    share = plan.prediction_for(512).truncated_share  # type: ignore[union-attr]
    assert "forecast from the plan" in output and f"{100 * share:.1f}%" in output
    assert f"--concurrency {plan.calibration.recommended_concurrency}" in output  # type: ignore[union-attr]
    assert "warning" not in output  # same files, same normalization


@pytest.mark.parametrize("args,message", [
    (["--max-tokens", "4096"], "make a plan with --max-tokens 4096"),
    (["--estimate-rps", "3"], "not both"),
])
def test_produce_refuses_what_the_plan_cannot_answer(calibrated: tuple[Path, str],
                                                     tmp_path: Path, args: list[str],
                                                     message: str) -> None:
    path, _ = calibrated
    code, output = invoke("produce", *FILES, "--run", "r3", "--gpus", "4", "--dry-run",
                          "--plan", str(path), "--state-dir", str(tmp_path), *args)
    assert code == 2 and message in output


def test_produce_names_a_bad_plan_file(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text('{"predictions": 3}')
    for path, message in ((bad, "not a tokenmill plan"), (tmp_path / "none.json", "No such")):
        code, output = invoke("produce", *FILES, "--run", "r4", "--gpus", "1", "--dry-run",
                              "--plan", str(path), "--state-dir", str(tmp_path))
        assert code == 2 and str(path) in output and message in output


def test_produce_warns_when_the_plan_read_other_data(calibrated: tuple[Path, str],
                                                     tmp_path: Path) -> None:
    path, _ = calibrated
    code, output = invoke("produce", FILES[0], "--run", "r5", "--gpus", "4", "--max-tokens",
                          "512", "--multi-turn", "per-user-turn", "--dry-run", "--plan",
                          str(path), "--state-dir", str(tmp_path), "--no-progress")
    assert code == 0
    assert "the plan was made for other input files" in output
    assert "--multi-turn last-user" in output


@pytest.mark.broker
def test_produce_stores_the_plans_estimate(calibrated: tuple[Path, str], settings: Settings,
                                           run_id: str) -> None:
    path, _ = calibrated
    plan = plan_decoder.decode(path.read_bytes())
    code, output = invoke("produce", *FILES, "--run", run_id, "--gpus", "2", "--max-tokens",
                          "1024", "--plan", str(path), "--bootstrap-servers",
                          settings.bootstrap_servers, "--state-dir", str(settings.state_dir),
                          "--no-progress")
    assert code == 0, output
    estimate = RunRegistry(settings).get(run_id).estimate
    # the plan's prediction for this run's max_tokens, scaled to its 2 GPUs
    assert estimate == run_estimate(plan, max_tokens=1024, gpus=2)
    assert estimate is not None and estimate.source == "plan" and estimate.gpus == 2
    four = plan.prediction_for(1024)
    assert four is not None and estimate.truncated_share == pytest.approx(four.truncated_share)
    assert estimate.hours is not None and estimate.hours > four.hours  # half the GPUs
    # re-running the same command is the same spec: it resumes (nothing to publish)
    code, output = invoke("produce", *FILES, "--run", run_id, "--gpus", "2", "--max-tokens",
                          "1024", "--plan", str(path), "--bootstrap-servers",
                          settings.bootstrap_servers, "--state-dir", str(settings.state_dir),
                          "--no-progress")
    assert code == 0 and "already fully published" in output


def test_specs_written_before_plans_still_decode() -> None:
    old = (b'{"run_id":"old","partitions":4,"estimate":{"requests_per_s":10.0,'
           b'"output_tokens":2400.0},"v":1}')
    spec = msgspec.json.decode(old, type=RunSpec)
    assert spec.estimate == Estimate(requests_per_s=10.0, output_tokens=2400.0)
    assert spec.estimate.truncated_share is None and spec.estimate.source is None


def test_a_plan_file_ignores_fields_it_does_not_know(calibrated: tuple[Path, str]) -> None:
    path, _ = calibrated
    raw = json.loads(path.read_text())
    raw["added_later"] = {"x": 1}
    raw["dataset"]["also_new"] = True
    assert isinstance(plan_decoder.decode(json.dumps(raw)), Plan)


@pytest.mark.parametrize("text,seconds", [("300", 300.0), ("90s", 90.0), ("5m", 300.0),
                                          ("1.5h", 5400.0), (" 2 min ", 120.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5m", "5x", "", "m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_the_plan_never_records_credentials() -> None:
    assert public_url("http://user:s3cret@gpu-1:30000/v1?key=x") == "http://gpu-1:30000/v1"
    assert public_url("https://gpu-1") == "https://gpu-1"
