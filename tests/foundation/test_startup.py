"""The start-up wait (tokenmill/startup.py): the pure deadline and backoff,
the loop around a check, and the worker's wait for its SGLang server (the
simulator answers /health 503 while it warms up, like SGLang loading a model)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer.health import wait_for_server
from devstack.processes import free_port
from sglang_sim import SimulatorConfig
from sglang_sim.runner import running_simulator
from tokenmill.startup import (
    MAX_DELAY_S,
    MIN_DELAY_S,
    DependencyDown,
    StartupLaps,
    StartupWait,
    process_age_s,
    retry_delay,
    wait_until_up,
)

IMPORTED = time.monotonic()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


@given(st.integers(min_value=1, max_value=10_000),
       st.floats(min_value=-10, max_value=1e6, allow_nan=False))
def test_a_delay_is_positive_capped_and_never_past_the_deadline(attempt: int,
                                                                remaining: float) -> None:
    delay = retry_delay(attempt, remaining)
    if remaining < MIN_DELAY_S:
        assert delay is None
    else:
        assert delay is not None and MIN_DELAY_S <= delay <= min(MAX_DELAY_S, remaining)


def test_delays_double_up_to_the_cap() -> None:
    assert [retry_delay(n, 1000) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


@given(st.floats(min_value=0, max_value=600, allow_nan=False),
       st.floats(min_value=0, max_value=20, allow_nan=False))
def test_the_wait_ends_within_timeout_plus_one_attempt(timeout_s: float, attempt_s: float) -> None:
    """Whatever the timeout and however long each try takes, the loop gives
    up after at most the timeout plus one try, with one line naming it all."""
    clock = FakeClock()
    wait = StartupWait("Kafka", "10.0.0.1:9092", timeout_s=timeout_s, clock=clock)

    def check() -> None:
        clock.sleep(attempt_s)
        raise ConnectionError("refused")

    with pytest.raises(DependencyDown) as raised:
        wait_until_up(check, wait, down=(ConnectionError,), sleep=clock.sleep)
    assert clock.now - 100.0 <= timeout_s + attempt_s + 1e-6
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("Kafka at 10.0.0.1:9092 is down: refused")


def test_timeout_zero_tries_once_and_does_not_sleep() -> None:
    clock = FakeClock()
    calls = []

    def check() -> None:
        calls.append(clock.now)
        raise ConnectionError("refused")

    with pytest.raises(DependencyDown, match="not waiting .*TOKENMILL_STARTUP_TIMEOUT_S is 0"):
        wait_until_up(check, StartupWait("S3", "http://s3", timeout_s=0, clock=clock),
                      down=(ConnectionError,), sleep=clock.sleep)
    assert calls == [100.0]


def test_it_returns_once_the_dependency_answers() -> None:
    clock = FakeClock()
    answers = iter([ConnectionError("refused"), ConnectionError("refused"), "cluster-1"])

    def check() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    wait = StartupWait("Kafka", "k:9092", timeout_s=60, clock=clock)
    assert wait_until_up(check, wait, down=(ConnectionError,), sleep=clock.sleep) == "cluster-1"
    assert wait.attempts == 2
    assert clock.now == 100.0 + 0.5 + 1.0


def test_other_errors_are_not_waited_for() -> None:
    clock = FakeClock()

    def check() -> None:
        raise PermissionError("access denied")

    with pytest.raises(PermissionError):
        wait_until_up(check, StartupWait("S3", "x", timeout_s=60, clock=clock),
                      down=(ConnectionError,), sleep=clock.sleep)
    assert clock.now == 100.0


async def test_the_worker_waits_for_a_server_that_is_still_loading() -> None:
    with running_simulator(SimulatorConfig(warmup_seconds=2.0)) as url:
        started = time.monotonic()
        with pytest.raises(DependencyDown, match=f"the SGLang server at {url} is down: "
                                                 "GET /health answered 503"):
            await wait_for_server(url, timeout_s=0)
        await wait_for_server(url, timeout_s=60)
        assert time.monotonic() - started >= 1.5  # it waited out the warm-up


async def test_a_server_that_never_answers_ends_the_wait_with_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(DependencyDown) as raised:
        await wait_for_server(url, timeout_s=1.5)
    assert time.monotonic() - started < 30
    assert f"the SGLang server at {url} is down: no answer" in str(raised.value)
    assert "waited" in str(raised.value)


def test_start_up_laps_add_up_to_the_total_and_keep_the_process_start() -> None:
    clock = FakeClock()
    laps = StartupLaps(clock=clock, before_s=1.5)
    clock.sleep(0.25)
    laps.lap("kafka")
    clock.sleep(2.0)
    laps.lap("transactions")
    clock.sleep(0.5)
    laps.lap("kafka")  # a step met twice adds up
    assert laps.summary() == {"process": 1.5, "kafka": 0.75, "transactions": 2.0, "total": 4.25}


def test_process_age_counts_from_the_process_start_not_from_the_import() -> None:
    age = process_age_s()
    assert age is not None  # Linux: /proc is there
    # the process is older than this module's import; /proc counts in 10 ms ticks
    assert time.monotonic() - IMPORTED - 0.02 <= age < 86_400
