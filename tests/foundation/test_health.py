"""The health rules behind `status` and `status --check` (ops/health.py),
the recent-rate window (consumer/recent_rate.py) and the S3 attempt
classifier (sink/s3_attempts.py)."""

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from consumer.recent_rate import RecentRate
from ops.health import Thresholds, assess, headroom, live_rates, member_state
from schemas.progress import ConsumerProgress, ProducerCheckpoint, ServerSnapshot, SinkProgress
from sink.s3_attempts import S3Errors, describe_attempt
from tokenmill.progress import RunProgress

NOW = 10_000.0


def _run(*, published: int = 1000, done: bool = True) -> RunProgress:
    state = RunProgress(run="r")
    state.producer = ProducerCheckpoint(run="r", next_seq=published, total=published, done=done)
    return state


def _worker(name: str, age: float, *, completions: int = 100, stopped: bool = False,
            work_age: float | None = None, **extra: object) -> ConsumerProgress:
    return ConsumerProgress(run="r", instance=name, completions=completions,
                            updated_at=NOW - age, heartbeat_s=10.0,
                            stopped_at=NOW - age if stopped else 0.0,
                            last_work_at=NOW - (age if work_age is None else work_age),
                            **extra)  # type: ignore[arg-type]


def _sink(name: str, age: float, *, records: int = 100, **extra: object) -> SinkProgress:
    return SinkProgress(run="r", instance=name, s3_records=records, updated_at=NOW - age,
                        last_upload_at=NOW - age, heartbeat_s=10.0, **extra)  # type: ignore[arg-type]


def test_member_states_follow_the_heartbeat() -> None:
    assert member_state(NOW - 5, 10, 0, NOW) == "active"
    assert member_state(NOW - 16, 10, 0, NOW) == "stale"
    assert member_state(NOW - 21, 10, 0, NOW) == "dead"
    assert member_state(NOW - 500, 10, NOW - 500, NOW) == "stopped"
    # a record without a heartbeat field: the old default (10 s)
    assert member_state(NOW - 25, 0, 0, NOW) == "dead"


@given(age=st.floats(0, 1e6), beat=st.floats(0.5, 600))
def test_a_member_is_dead_exactly_when_two_heartbeats_passed(age: float, beat: float) -> None:
    state = member_state(NOW - age, beat, 0, NOW)
    assert (state == "dead") == (age > 2 * beat)
    assert state != "stopped"


def test_a_healthy_run_has_no_problems() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 3, completions=500)
    state.sinks["s0"] = _sink("s0", 2, records=400)
    health = assess(state, NOW)
    assert health.state == "running" and health.problems == [] and health.exit_code == 0


def test_every_worker_dead_stalls_the_run_critically() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 25, in_flight=70)
    state.consumers["gpu1"] = _worker("gpu1", 40)
    state.sinks["s0"] = _sink("s0", 2)
    health = assess(state, NOW)
    assert health.state == "stalled" and health.exit_code == 2
    critical = [p for p in health.problems if p.severity == "critical"]
    assert len(critical) == 1 and "no live worker" in critical[0].message
    assert "gpu0" in critical[0].message and "800 published prompts" in critical[0].message
    assert {p.subject for p in health.problems if p.severity == "warning"} == {
        "worker gpu0", "worker gpu1"}


def test_dead_workers_stop_counting_toward_rates() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 25, recent_requests_per_s=9.0,
                                      recent_tokens_per_s=900.0, recent_window_s=300.0)
    state.consumers["gpu1"] = _worker("gpu1", 1, recent_requests_per_s=2.0,
                                      recent_tokens_per_s=200.0, recent_window_s=120.0)
    rps, tps, window = live_rates(state, assess(state, NOW))
    assert (rps, tps, window) == (2.0, 200.0, 120.0)


def test_a_stopped_worker_is_not_a_problem_while_another_lives() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 500, stopped=True)
    state.consumers["gpu1"] = _worker("gpu1", 1)
    state.sinks["s0"] = _sink("s0", 1)
    assert assess(state, NOW).problems == []


def test_no_live_sink_with_results_waiting_is_critical() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 1, completions=600)
    state.sinks["s0"] = _sink("s0", 60, records=100)
    health = assess(state, NOW)
    assert health.exit_code == 2
    assert any("no live sink, 500 results wait" in p.message for p in health.problems)


def test_members_that_heartbeat_but_commit_nothing_are_a_wedged_stall() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 1, work_age=900, partitions=4, in_flight=32)
    state.sinks["s0"] = _sink("s0", 1)
    state.sinks["s0"] = SinkProgress(run="r", instance="s0", s3_records=100, updated_at=NOW - 1,
                                     last_upload_at=NOW - 800, heartbeat_s=10.0)
    health = assess(state, NOW, Thresholds(stall_after_s=600))
    assert health.state == "stalled"
    [problem] = [p for p in health.problems if p.severity == "critical"]
    assert "nothing committed for 13m" in problem.message and "wedged? gpu0" in problem.message
    # under the threshold it is not stalled
    assert assess(state, NOW, Thresholds(stall_after_s=1000)).problems == []


def test_a_stall_behind_open_breakers_names_the_servers() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 1, work_age=900, breaker="server_error")
    state.sinks["s0"] = SinkProgress(run="r", instance="s0", s3_records=100, updated_at=NOW - 1,
                                     last_upload_at=NOW - 900, heartbeat_s=10.0)
    health = assess(state, NOW)
    messages = [p.message for p in health.problems]
    assert any("every live worker's server is failing" in m for m in messages)
    assert any("circuit breaker open" in m for m in messages)


def test_s3_trouble_is_a_warning_and_an_s3_exit_is_critical() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 1)
    state.sinks["s0"] = _sink("s0", 1, uploading_since=NOW - 200, upload_errors=3,
                              last_error="ReadTimeoutError: read timeout")
    health = assess(state, NOW, Thresholds(upload_stall_s=120))
    [problem] = health.problems
    assert problem.severity == "warning" and "S3 upload in flight for 3m" in problem.message
    assert "3 failed attempts" in problem.message
    state.sinks["s0"] = _sink("s0", 100, last_error="s3 write failed after retries",
                              last_error_at=NOW - 100)
    health = assess(state, NOW)
    assert any(p.severity == "critical" and "exited on: s3 write failed" in p.message
               for p in health.problems)


def test_share_thresholds() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 1, completions=100, failures=10,
                                      finish_reasons={"stop": 60, "length": 40})
    state.sinks["s0"] = _sink("s0", 1, records=50, dlq_records=50)
    lines = [p.line() for p in assess(state, NOW).problems]
    assert any(line.startswith("CRITICAL: run: 9.1% of results are failures") for line in lines)
    assert any("40.0% of answers truncated" in line for line in lines)
    assert any("50.0% of results went to the dead-letter topic" in line for line in lines)
    relaxed = Thresholds(max_failure_share=0.2, max_truncated_share=0.5, max_dlq_share=0.6)
    assert assess(state, NOW, relaxed).problems == []


def test_a_complete_run_is_not_stalled_by_its_stopped_members() -> None:
    state = _run(published=100)
    state.consumers["gpu0"] = _worker("gpu0", 5000, completions=100, stopped=True)
    state.sinks["s0"] = _sink("s0", 5000, records=100)
    health = assess(state, NOW)
    assert health.state == "complete" and health.exit_code == 0


def test_unowned_partitions_warn_after_their_grace() -> None:
    state = _run()
    state.consumers["gpu0"] = _worker("gpu0", 1)
    state.sinks["s0"] = _sink("s0", 1)
    assert assess(state, NOW, unowned={3: 10.0}).problems == []
    [problem] = assess(state, NOW, unowned={3: 90.0}).problems
    assert problem.subject == "partition 3" and "owned by no worker for 90s" in problem.message


def test_headroom_answers_can_the_batch_grow() -> None:
    assert headroom(None).verdict == "unknown"
    full = ServerSnapshot(running=30, token_usage=0.97, max_running_requests=64, at=NOW)
    assert headroom(full).verdict == "no" and "KV cache 97% used" in headroom(full).reason
    queued = ServerSnapshot(running=64, queued=12, token_usage=0.5, max_running_requests=64,
                            at=NOW)
    assert headroom(queued).verdict == "no" and "12 queued" in headroom(queued).reason
    room = ServerSnapshot(running=16, token_usage=0.3, max_running_requests=64, at=NOW)
    assert headroom(room).verdict == "yes"


def test_recent_rate_covers_the_last_window_only() -> None:
    rate = RecentRate(window_s=300)
    rate.add(0, 0, 0)
    for t in range(10, 1001, 10):  # 1 request/s for 500 s, then 0.1/s
        done = t if t <= 500 else 500 + (t - 500) // 10
        rate.add(t, done, done * 100)
    now_rates = rate.rates(1010, 551, 55_100)
    assert abs(now_rates.requests_per_s - 0.1) < 0.01 and now_rates.window_s == 300
    assert RecentRate().rates(5, 1, 1).window_s == 0  # no sample yet: no rate


@given(st.lists(st.tuples(st.floats(0.1, 100), st.integers(0, 50)), min_size=1, max_size=60))
def test_recent_rate_never_exceeds_the_work_done_in_its_span(steps: list[tuple[float, int]]
                                                            ) -> None:
    rate = RecentRate(window_s=120)
    t, total = 0.0, 0
    rate.add(t, total, 0)
    for dt, n in steps:
        t, total = t + dt, total + n
        rates = rate.rates(t, total, 0)
        assert 0 <= rates.requests_per_s * rates.window_s <= total + 1e-6
        assert rates.window_s <= max(120.0, t) + 1e-6
        rate.add(t, total, 0)


def test_s3_attempts_that_failed_are_counted() -> None:
    ok = (SimpleNamespace(status_code=200), {})
    missing = (SimpleNamespace(status_code=404), {})
    busy = (SimpleNamespace(status_code=503), {})
    assert describe_attempt(ok, None) is None and describe_attempt(missing, None) is None
    assert describe_attempt(busy, None) == "HTTP 503 from S3"
    assert describe_attempt(None, TimeoutError("read timed out")) == (
        "TimeoutError: read timed out")
    errors = S3Errors()
    errors._on_attempt(response=busy)
    errors._on_attempt(response=ok)
    assert errors.count == 1 and errors.last == "HTTP 503 from S3"
