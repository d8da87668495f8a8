"""The one backoff formula (tokenmill/backoff.py) and its three users: the
same delays as the formulas it replaced, capped, never shrinking."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from consumer.backoff import RetryPolicy
from tokenmill.backoff import Backoff
from tokenmill.kafka.transactions import STEP_BACKOFF
from tokenmill.startup import retry_delay

seconds = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)
attempts = st.integers(min_value=1, max_value=5000)


@given(first=seconds, cap=seconds, attempt=attempts)
def test_a_delay_never_exceeds_the_cap_nor_shrinks_with_attempts(first: float, cap: float,
                                                                  attempt: int) -> None:
    backoff = Backoff(first_s=first, cap_s=cap)
    assert 0.0 <= backoff.delay(attempt) <= cap
    assert backoff.delay(attempt) <= backoff.delay(attempt + 1)


@given(first=seconds, cap=seconds, attempt=st.integers(min_value=1, max_value=1000))
def test_the_delay_is_the_doubling_formula_it_replaced(first: float, cap: float,
                                                       attempt: int) -> None:
    # transactions.Backoff and RetryPolicy's ceiling, as they were
    assert Backoff(first_s=first, cap_s=cap).delay(attempt) == min(cap, first * 2 ** (attempt - 1))


@given(attempt=attempts, remaining=st.floats(min_value=0.05, max_value=1e6))
def test_startup_delays_are_the_ones_before(attempt: int, remaining: float) -> None:
    before = min(min(5.0, 0.5 * 2 ** min(attempt - 1, 30)), remaining)
    assert retry_delay(attempt, remaining) == before


def test_transaction_steps_back_off_as_before() -> None:
    assert [STEP_BACKOFF.delay(a) for a in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0]


@given(base=seconds, cap=seconds, attempt=st.integers(min_value=1, max_value=100),
       seed=st.integers(0, 2**32))
def test_only_the_generation_retry_jitters_within_the_upper_half(
        base: float, cap: float, attempt: int, seed: int) -> None:
    policy = RetryPolicy(base_s=base, cap_s=cap)
    ceiling = Backoff(first_s=base, cap_s=cap).delay(attempt)
    delay = policy.delay(attempt, random.Random(seed))
    assert ceiling / 2 <= delay <= ceiling <= cap
    assert delay == random.Random(seed).uniform(ceiling / 2, ceiling)
