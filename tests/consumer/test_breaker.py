"""The circuit breaker (consumer/breaker.py), pure, with a fake clock."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from consumer.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_cause_dominating_opens_it_and_holds_the_rest() -> None:
    clock = Clock()
    b = Breaker(window=10, threshold=0.9, cooldown_s=30, clock=clock)
    recorded = sum(b.failure("prompt_too_long") for _ in range(100))
    assert recorded == 9  # the 10th (a full window) opened it and was held, like all after it
    assert b.state == "open" and b.cause == "prompt_too_long" and not b.may_start()


def test_mixed_outcomes_never_open_it() -> None:
    b = Breaker(window=10, threshold=0.9)
    for i in range(200):
        if i % 3:
            b.success()
        else:
            assert b.failure("bad_request")
    assert b.state == "closed"


def test_half_open_probe_closes_or_reopens_for_twice_as_long() -> None:
    clock = Clock()
    b = Breaker(window=4, threshold=0.75, cooldown_s=10, clock=clock)
    for _ in range(4):
        b.failure("server_error")
    assert b.state == "open"
    clock.now = 9.9
    assert not b.may_start()
    clock.now = 10.0
    assert b.may_start() and b.state == "half-open"
    assert not b.may_start()  # one probe at a time
    assert b.failure("server_error") is False  # the probe failed the same way
    assert b.state == "open" and b.seconds_to_probe() == 20.0
    clock.now = 30.0
    assert b.may_start()
    b.success()
    assert b.state == "closed" and b.may_start()


def test_a_probe_failing_its_own_way_is_recorded() -> None:
    clock = Clock()
    b = Breaker(window=4, threshold=0.75, cooldown_s=1, clock=clock)
    for _ in range(4):
        b.failure("server_error")
    clock.now = 1.0
    assert b.may_start()
    assert b.failure("prompt_too_long") is True  # that prompt's own fault
    assert b.may_start()  # the next probe may go


def test_cooldown_is_capped() -> None:
    clock = Clock()
    b = Breaker(window=2, threshold=1.0, cooldown_s=100, max_cooldown_s=300, clock=clock)
    b.failure("x")
    b.failure("x")
    for _ in range(5):
        clock.now += b.seconds_to_probe()
        assert b.may_start()
        b.failure("x")
    assert b.seconds_to_probe() == 300


@given(st.lists(st.sampled_from(["ok", "a", "b"]), max_size=300))
def test_a_server_that_starts_failing_costs_at_most_one_window(history) -> None:
    """Whatever came before, once every request fails the same way, at most
    `window` of those failures are recorded before the breaker holds them."""
    b = Breaker(window=20, threshold=0.9, clock=Clock())
    for outcome in history:
        if b.state != "closed":
            break
        if outcome == "ok":
            b.success()
        else:
            b.failure(outcome)
    if b.state == "closed":
        recorded = sum(b.failure("a") for _ in range(500))
        assert b.state == "open" and recorded < 20


def test_an_old_request_ending_while_half_open_is_not_the_probe() -> None:
    clock = Clock()
    b = Breaker(window=4, threshold=0.75, cooldown_s=1, clock=clock)
    for _ in range(4):
        b.failure("server_error", started=0.0)
    clock.now = 1.0
    assert b.may_start() and b.state == "half-open"  # the probe starts at 1.0
    b.success(started=0.5)  # began before the failures: says nothing about the server now
    assert b.state == "half-open" and not b.may_start()
    assert b.failure("server_error", started=0.5) is False  # held, and the probe still runs
    assert not b.may_start()
    assert b.failure("server_error", started=1.0) is False  # the probe: open again, twice as long
    assert b.state == "open" and b.seconds_to_probe() == 2.0


@given(st.integers(0, 16),
       st.lists(st.tuples(st.sampled_from(["old-ok", "start", "fail", "wait"]),
                          st.integers(1, 30)), max_size=40))
@example(in_flight=1, runs=[("start", 18), ("fail", 18), ("wait", 1), ("start", 1),
                            ("old-ok", 1), ("start", 20), ("fail", 21)])
def test_once_open_old_successes_cannot_reopen_the_floodgate(in_flight, runs) -> None:
    """A server fails every request from t=1 on; `in_flight` requests begun
    before that go on succeeding, in any order with new requests starting
    and failing, probes and cooldowns. Once the breaker has opened, no
    further failure is recorded: an old success landing while half-open must
    not close it on a server that still fails everything. (Before it opens,
    each old success can dilute the window, so at most a window per old
    success is recorded.)"""
    clock = Clock()
    clock.now = 1.0
    b = Breaker(window=20, threshold=0.9, cooldown_s=1, clock=clock)
    for _ in range(20):
        b.success(started=0.0)
    old, started, recorded, after_open = in_flight, [], 0, 0
    for step, repeat in runs:
        for _ in range(repeat):
            if step == "old-ok" and old:
                old -= 1
                b.success(started=0.5)
            elif step == "start" and b.may_start():
                started.append(clock.now)
            elif step == "fail" and started:
                opened = b.trips > 0
                allowed = b.failure("server_error", started=started.pop(0))
                recorded += allowed
                after_open += allowed and opened
            elif step == "wait":
                clock.now += 1.0
    assert after_open == 0
    assert recorded < 20 * (in_flight + 1)
