"""The circuit breaker and the up-front checks against real worker processes:
a server that starts failing every request (400 for context length, 501 from
something that is not SGLang) costs at most about one breaker window of
failure records, the run resumes when the server recovers, exactly once; a
server whose context cannot hold max_tokens, or a URL that is not http(s),
is refused at start with one line."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from schemas import Failure
from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import (
    REPO,
    ConsumerProcess,
    committed_records,
    consumer_progress,
    create_run,
    duplicates,
    make_prompts,
    publish,
    wait_until,
)
from tests.gate import Gate

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PACED = SimulatorConfig(decode_rate=300.0, length_median=40, length_sigma=0.3, length_max=100,
                        max_running_requests=256, prefill_rate=0)
FAILURES = {
    "400": (400, "Requested token count exceeds the model's maximum context length of 400 "
                 "tokens. You requested a total of 700 tokens."),
    "501": (501, "Not Implemented"),
}


def _failures(settings, run_id) -> int:
    return consumer_progress(settings, run_id).consumer_total("failures")


def _settled(count: Callable[[], int], quiet_s: float, timeout_s: float) -> int:
    """The count once it has not moved for `quiet_s` (a condition, not a
    guess at how long the work in flight takes on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    value, since = count(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"still moving after {timeout_s}s: {value}"
        time.sleep(0.5)  # the poll of this wait loop
        now = count()
        if now != value:
            value, since = now, time.monotonic()
    return value


@pytest.mark.parametrize("failing", ["400", "501"])
def test_a_server_failing_everything_costs_one_window_then_the_run_resumes(
        settings, run_id, tmp_path, failing) -> None:
    spec = create_run(settings, run_id, partitions=2)
    # the first 150 requests answered before the failures; the rest wait in the
    # gate until the server fails, so the failures come mid-run by construction,
    # and once they begin nothing succeeds (the held ones fail when released)
    prompts = make_prompts(run_id, 500)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as upstream, Gate(upstream) as gate:
        before = gate.hold(after=150)
        worker = ConsumerProcess(settings, run_id, gate.url(), "b0", tmp_path,
                                 "--concurrency", "16", "--until-done", "--breaker-cooldown", "1",
                                 # probes at most 2 s apart: the recovery is found within 2 s
                                 "--breaker-max-cooldown", "2",
                                 "--max-attempts", "2", "--retry-base", "0.05").start()
        try:
            wait_until(lambda: consumer_progress(settings, run_id).generated > 100, 60,
                       "healthy progress")
            # every request in flight is held: none answered after the failures begin
            gate.wait(lambda: gate.count().held == 16 == gate.count().pending, 60,
                      "the worker's 16 requests held")
            gate.fail(*FAILURES[failing])  # the server starts failing every request
            before.release()  # those held fail too, and every later one
            opened = ("circuit breaker open: the server fails every request the same way; "
                      "holding prompts (their offsets stay uncommitted) and probing again")
            wait_until(lambda: worker.events(opened), 60, "the breaker opening")
            # what was in flight when it opened settles (the count stops moving);
            # then, across probes that keep failing (cooldown 1 s, doubling to 2 s),
            # nothing more is committed
            settled = _settled(lambda: consumer_progress(settings, run_id).generated,
                               quiet_s=3, timeout_s=90)
            probes = gate.count().failed
            gate.wait(lambda: gate.count().failed > probes, 60, "the next probe failing")
            assert consumer_progress(settings, run_id).generated == settled
            assert consumer_progress(settings, run_id).consumers["b0"].breaker
            gate.pass_through()  # the server recovers
            assert worker.wait(180) == 0, worker.log()[-3000:]
            assert worker.events("circuit breaker closed: the server answers again")
        finally:
            worker.stop()
    records = committed_records(settings, run_id)
    assert duplicates(records) == {}
    assert {r.id for r in records} == {p.id for p in prompts}
    failures = [r for r in records if isinstance(r, Failure)]
    # one breaker window: with no success between the failures, the 18th of 20
    # trips it and is held, like every failure after it
    assert 1 <= len(failures) <= 20


def test_a_context_that_cannot_hold_max_tokens_is_refused_at_start(settings, run_id,
                                                                    tmp_path) -> None:
    create_run(settings, run_id, partitions=1, max_tokens=512)
    with running_simulator(SimulatorConfig(context_length=400)) as url:
        worker = ConsumerProcess(settings, run_id, url, "c0", tmp_path).start()
        assert worker.wait(60) == 1
    log = worker.log()
    errors = [line for line in log.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "context length of 400" in errors[0] and "Traceback" not in log


@pytest.mark.parametrize("url", ["not-a-url", "ftp://127.0.0.1:21", "http://", "http://h:99999"])
def test_a_malformed_server_url_is_a_usage_error(url) -> None:
    result = subprocess.run([sys.executable, "-m", "tokenmill.cli", "consume", "--run", "r",
                             "--sglang-url", url], capture_output=True, text=True, cwd=REPO,
                            timeout=60)
    assert result.returncode == 2
    assert "--sglang-url" in result.stderr and "Traceback" not in result.stderr
