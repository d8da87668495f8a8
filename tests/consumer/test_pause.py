"""The fetch pause policy (consumer/pause.py): pure, so its bounds are shown
over arbitrary sequences of what a worker sees."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from consumer.pause import PAUSE_AFTER_FULL_S, PausePolicy

LIMIT = 8

# (seconds since the previous look, records buffered) at each look
looks = st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(0, LIMIT)), max_size=60)


def test_a_short_burst_of_a_full_buffer_does_not_pause() -> None:
    policy = PausePolicy()
    assert not policy.want(buffered=LIMIT, limit=LIMIT, paused=False, stopping=False,
                           server_up=True, now=100.0)
    assert not policy.want(buffered=LIMIT, limit=LIMIT, paused=False, stopping=False,
                           server_up=True, now=100.0 + PAUSE_AFTER_FULL_S - 0.01)
    assert policy.want(buffered=LIMIT, limit=LIMIT, paused=False, stopping=False,
                       server_up=True, now=100.0 + PAUSE_AFTER_FULL_S)


def test_a_slot_freed_restarts_the_clock() -> None:
    policy = PausePolicy()
    policy.want(buffered=LIMIT, limit=LIMIT, paused=False, stopping=False, server_up=True,
                now=0.0)
    policy.want(buffered=LIMIT - 1, limit=LIMIT, paused=False, stopping=False,
                server_up=True, now=PAUSE_AFTER_FULL_S - 0.5)
    assert not policy.want(buffered=LIMIT, limit=LIMIT, paused=False, stopping=False,
                           server_up=True, now=PAUSE_AFTER_FULL_S + 0.5)


def test_stopping_or_a_server_down_pauses_at_once() -> None:
    for stopping, server_up in ((True, True), (False, False)):
        assert PausePolicy().want(buffered=0, limit=LIMIT, paused=False, stopping=stopping,
                                  server_up=server_up, now=0.0)


@given(looks)
def test_a_full_buffer_never_goes_unpolled_past_the_delay(seen) -> None:
    """A worker polls (and so answers its group's rebalance callbacks) unless
    its buffer is full and fetching is not paused: the policy pauses within
    PAUSE_AFTER_FULL_S of the buffer filling, so no callback waits longer
    (with one look per step of the worker's loop: its 50 ms added)."""
    policy, paused, now = PausePolicy(), False, 0.0
    full_since: float | None = None
    for step, buffered in seen:
        now += step
        if buffered < LIMIT:
            full_since = None
        elif full_since is None:
            full_since = now
        paused = policy.want(buffered=buffered, limit=LIMIT, paused=paused, stopping=False,
                             server_up=True, now=now)
        if buffered >= LIMIT and not paused:
            assert full_since is not None and now - full_since < PAUSE_AFTER_FULL_S


@given(looks)
def test_once_paused_fetching_resumes_only_at_half_the_limit(seen) -> None:
    """Hysteresis: no pause-resume churn while the buffer is above half."""
    policy, paused, now = PausePolicy(), False, 0.0
    for step, buffered in seen:
        now += step
        was = paused
        paused = policy.want(buffered=buffered, limit=LIMIT, paused=paused, stopping=False,
                             server_up=True, now=now)
        if was and not paused:
            assert buffered <= LIMIT // 2
