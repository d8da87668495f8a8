"""Fault knobs over real HTTP: warm-up, errors, retries, aborts, stalls, bad answers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.simulator.sim_helpers import chat, http, metric_values, user

pytestmark = pytest.mark.timeout(60)


def test_warmup_503_then_200(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, warmup_seconds=1.0)
    assert http("GET", url + "/health")[0] == 503
    assert http("GET", url + "/health_generate")[0] == 503
    status, err = chat(url, user("too early"))
    assert status == 503 and err["object"] == "error" and err["code"] == 503
    deadline = time.monotonic() + 10
    while http("GET", url + "/health")[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)  # poll of a wait loop
    assert chat(url, user("now"))[0] == 200


def test_error_rate_and_body(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, error_rate=0.3)
    errors = 0
    for i in range(300):
        status, body = chat(url, user(f"prompt {i}", max_tokens=16))
        if status != 200:
            errors += 1
            assert status == 500
            assert body == {"object": "error", "message": "Internal server error: simulated fault",
                            "type": "InternalServerError", "param": None, "code": 500}
    assert 60 <= errors <= 120
    assert metric_values(url)["sglang:num_requests_total"] == 300 - errors


def test_retries_of_the_same_prompt_succeed_with_the_same_answer(
        simulator: Callable[..., str]) -> None:
    flaky = simulator(zero_delay=True, error_rate=0.6)
    clean = simulator(zero_delay=True)
    body = user("retry me", max_tokens=300)
    for attempt in range(50):
        status, got = chat(flaky, body)
        if status == 200:
            break
    else:
        pytest.fail("no retry succeeded")
    _, want = chat(clean, body)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]


def test_abort_rate(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, abort_rate=0.5)
    aborted = 0
    for i in range(200):
        status, body = chat(url, user(f"abort? {i}", max_tokens=4000, return_meta_info=True))
        assert status == 200
        choice = body["choices"][0]
        if choice["finish_reason"] == "abort":
            aborted += 1
            assert choice["matched_stop"] is None
            assert choice["meta_info"]["finish_reason"]["type"] == "abort"
            assert body["usage"]["completion_tokens"] < 4000
    assert 70 <= aborted <= 130
    assert metric_values(url)["sglang:num_aborted_requests_total"] == aborted


def test_empty_and_trivial_answers(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, empty_rate=0.2, trivial_rate=0.2)
    empty = trivial = 0
    for i in range(250):
        _, body = chat(url, user(f"content {i}", max_tokens=8000))
        message = body["choices"][0]["message"]
        if message["content"] == "" and message["reasoning_content"] is None:
            empty += 1
            assert body["choices"][0]["finish_reason"] == "stop"
        elif message["content"] == "OK.":
            trivial += 1
    assert 25 <= empty <= 75 and 25 <= trivial <= 75
    # a pure function of the prompt: asking again gives the same bad answer
    _, a = chat(url, user("content 0", max_tokens=8000))
    _, b = chat(url, user("content 0", max_tokens=8000))
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


def test_stall(simulator: Callable[..., str]) -> None:
    url = simulator(zero_delay=True, stall_rate=1.0, stall_seconds=0.4)
    t0 = time.perf_counter()
    status, _ = chat(url, user("stall", max_tokens=8))
    assert status == 200 and time.perf_counter() - t0 >= 0.4
