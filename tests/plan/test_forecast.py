"""Forecast arithmetic: answer lengths from a censored stratified sample, the
throughput curve, makespan, hours and cost."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.plan import Answer, Curve
from tokenmill.forecast import makespan
from tokenmill.forecast.lengths import LengthDistribution
from tokenmill.forecast.throughput import (
    concurrency_for_share,
    recommended_concurrency,
    shape,
    tokens_per_s,
)

M = 4096

answers_strategy = st.lists(
    st.builds(Answer, stratum=st.integers(0, 2), tokens=st.integers(1, M),
              outcome=st.sampled_from(["stop", "stop", "stop", "length", "unfinished"])),
    min_size=1, max_size=80,
).map(lambda xs: [Answer(a.stratum, M, "length") if a.outcome == "length" else a for a in xs])
weights = {0: 5.0, 1: 1.0, 2: 2.5}


# ------------------------------------------------------------------ lengths


@given(st.lists(st.integers(1, M), min_size=1, max_size=100), st.integers(1, M))
def test_without_censoring_the_share_is_the_empirical_share(lengths: list[int], m: int) -> None:
    d = LengthDistribution([Answer(0, t, "stop") for t in lengths], {0: 1.0}, M)
    assert d.truncated_share(m) == pytest.approx(sum(t > m for t in lengths) / len(lengths))
    assert d.mean_output_tokens(m) == pytest.approx(statistics.fmean(min(t, m) for t in lengths))


@given(answers_strategy)
def test_truncated_share_never_grows_with_max_tokens(answers: list[Answer]) -> None:
    d = LengthDistribution(answers, weights, M)
    budgets = sorted({1, M, *(a.tokens for a in answers), *(a.tokens - 1 for a in answers if
                                                           a.tokens > 1)})
    shares = [d.truncated_share(m) for m in budgets]
    assert all(0.0 <= s <= 1.0 for s in shares)
    assert all(a >= b - 1e-12 for a, b in zip(shares, shares[1:], strict=False))


@settings(max_examples=60)
@given(answers_strategy, st.integers(1, M - 1))
def test_one_more_token_of_budget_adds_the_share_still_running(answers: list[Answer],
                                                               m: int) -> None:
    d = LengthDistribution(answers, weights, M)
    # E[min(L, m+1)] - E[min(L, m)] = P(L > m)
    assert d.mean_output_tokens(m + 1) - d.mean_output_tokens(m) == pytest.approx(
        d.truncated_share(m), abs=1e-9)
    assert 0 < d.mean_output_tokens(m) <= m * (1 + 1e-12)  # a weighted mean: float rounding


def test_answers_cut_at_max_tokens_count_as_truncated_at_every_candidate() -> None:
    answers = [Answer(0, 100, "stop")] * 6 + [Answer(0, M, "length")] * 4
    d = LengthDistribution(answers, {0: 1.0}, M)
    assert d.truncated_share(M) == pytest.approx(0.4)
    assert d.truncated_share(100) == pytest.approx(0.4)
    assert d.truncated_share(99) == pytest.approx(1.0)
    assert d.mean_output_tokens(M) == pytest.approx(0.6 * 100 + 0.4 * M)


def test_unfinished_answers_are_censored_not_dropped() -> None:
    # Kaplan-Meier by hand: events at 100 (1 of 4 at risk), 300 (1 of 2 at risk);
    # one answer unfinished at 200 (longer than 200), one cut at M.
    answers = [Answer(0, 100, "stop"), Answer(0, 200, "unfinished"), Answer(0, 300, "stop"),
               Answer(0, M, "length")]
    d = LengthDistribution(answers, {0: 1.0}, M)
    assert d.truncated_share(150) == pytest.approx(3 / 4)
    assert d.truncated_share(250) == pytest.approx(3 / 4)
    assert d.truncated_share(300) == pytest.approx(3 / 4 * 1 / 2)
    # dropping the unfinished one would have said 1/3 past 300: biased short
    assert d.truncated_share(300) > 1 / 3


def test_strata_are_weighted_by_their_share_of_the_dataset() -> None:
    answers = [Answer(0, 10, "stop")] * 10 + [Answer(1, M, "length")] * 2
    d = LengthDistribution(answers, {0: 900.0, 1: 100.0}, M)
    # stratum 1 is 10% of the dataset, though 1/6 of the sample
    assert d.truncated_share(100) == pytest.approx(0.1)


def test_a_budget_beyond_the_sample_is_refused() -> None:
    d = LengthDistribution([Answer(0, 10, "stop")], {0: 1.0}, 1000)
    with pytest.raises(ValueError, match="outside what the sample measured"):
        d.truncated_share(2000)


@given(answers_strategy, st.integers(1, M), st.integers(1, 500))
def test_quantiles_are_sorted_lengths_within_the_budget(answers: list[Answer], m: int,
                                                        n: int) -> None:
    q = LengthDistribution(answers, weights, M).quantiles(m, n)
    assert len(q) == n and q == sorted(q) and all(1 <= x <= m for x in q)


def test_quantiles_reproduce_the_mean() -> None:
    answers = [Answer(0, t, "stop") for t in range(1, 1001)]
    d = LengthDistribution(answers, {0: 1.0}, 2000)
    assert statistics.fmean(d.quantiles(600, 4000)) == pytest.approx(d.mean_output_tokens(600),
                                                                     rel=0.01)


# ------------------------------------------------------------------ throughput curve

curves = st.builds(Curve, max_tokens_per_s=st.floats(10, 1e6), knee=st.floats(0.5, 500),
                   sharpness=st.sampled_from([0.75, 1.0, 2.0, 4.0, 16.0, 64.0]))


@given(curves, st.floats(0.01, 1e4), st.floats(0.01, 1e4))
def test_curve_grows_towards_its_plateau(curve: Curve, a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert tokens_per_s(curve, lo) <= tokens_per_s(curve, hi) + 1e-9 * curve.max_tokens_per_s
    assert tokens_per_s(curve, hi) <= curve.max_tokens_per_s * (1 + 1e-12)


@given(curves, st.floats(0.05, 0.99))
def test_concurrency_for_share_inverts_the_curve(curve: Curve, share: float) -> None:
    c = concurrency_for_share(curve, share)
    assert tokens_per_s(curve, c) == pytest.approx(share * curve.max_tokens_per_s, rel=1e-6)


def test_shape_limits() -> None:
    assert shape(1e-6, 2.0) == pytest.approx(1e-6)  # linear below the knee
    assert shape(1e6, 2.0) == pytest.approx(1.0)  # the plateau above it
    assert shape(1e30, 64.0) == pytest.approx(1.0)  # no overflow


@given(curves, st.integers(1, 1024))
def test_recommended_concurrency_is_past_the_knee_and_capped(curve: Curve, highest: int) -> None:
    knee, recommended, saturated = recommended_concurrency(curve, highest)
    assert 1 <= knee <= recommended <= highest
    if saturated:
        assert tokens_per_s(curve, knee) >= 0.95 * curve.max_tokens_per_s * (1 - 1e-9)
        assert knee == 1 or tokens_per_s(curve, knee - 1) < 0.95 * curve.max_tokens_per_s
    else:
        assert knee == recommended == highest


# ------------------------------------------------------------------ makespan


def linear(rate_each: float, cap: float = math.inf):  # type: ignore[no-untyped-def]
    return lambda m: min(m * rate_each, cap)


def test_one_request_alone() -> None:
    assert makespan.makespan_seconds([500], 1, 8, linear(50.0)) == pytest.approx(10.0)


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=50), st.floats(1, 500))
def test_with_a_slot_for_each_request_the_longest_sets_the_end(lengths: list[int],
                                                               rate: float) -> None:
    seconds = makespan.makespan_seconds(lengths, len(lengths), len(lengths), linear(rate))
    assert seconds == pytest.approx(max(lengths) / rate)


@settings(max_examples=50)
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40), st.integers(1, 400),
       st.integers(1, 64), st.floats(1, 100), st.floats(10, 5000))
def test_never_faster_than_the_plateau_allows(lengths: list[int], jobs: int, concurrency: int,
                                              each: float, cap: float) -> None:
    rate = linear(each, cap)
    seconds = makespan.makespan_seconds(lengths, jobs, concurrency, rate, seed=1)
    order = list(lengths)
    random.Random(1).shuffle(order)  # the order makespan_seconds takes them in
    total = sum(order[i % len(order)] for i in range(jobs))
    assert seconds >= total / rate(concurrency) * (1 - 1e-9)
    more = makespan.makespan_seconds(lengths, jobs + 1, concurrency, rate, seed=1)
    assert seconds <= more * (1 + 1e-9)


def test_long_runs_approach_tokens_over_throughput() -> None:
    lengths = [100, 2000, 500, 800, 4000, 300]
    rate = linear(40.0, 800.0)
    jobs = 200_000  # beyond SIMULATED_JOBS: steady state in closed form
    seconds = makespan.makespan_seconds(lengths, jobs, 25, rate)
    steady = jobs * statistics.fmean(lengths) / 800.0
    assert steady <= seconds <= steady * 1.001


def test_expected_maximum_of_normals() -> None:
    assert makespan.expected_max_normal(1) == 0.0
    assert makespan.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-4)
    assert makespan.expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), abs=1e-4)


def test_busiest_gpu_carries_more_than_the_mean_share() -> None:
    lengths = [100, 200, 300, 400, 500]
    assert makespan.busiest_gpu_lengths(lengths, 1000, 1) == lengths
    scaled = makespan.busiest_gpu_lengths(lengths, 1000, 3)
    excess = 1.5 / math.sqrt(math.pi) * statistics.pstdev(lengths) / (300 * math.sqrt(1000))
    assert scaled == pytest.approx([x * (1 + excess) for x in lengths])
    # the excess fades as each GPU's share grows
    big = makespan.busiest_gpu_lengths(lengths, 10**6, 7)
    assert big[0] / lengths[0] - 1 < 0.002


def test_the_seed_runs_arithmetic() -> None:
    # 913,786 prompts at the 5.6 req/s and 2,306 tokens the operator estimated, 7 GPUs
    p = makespan.from_rates(prompts=913_786, requests_per_s=5.6, output_tokens=2306, gpus=7,
                            gpu_hour_cost=4.5)
    assert p.hours == pytest.approx(913_786 / 5.6 / 3600)  # 45.3 h: the seed's "~45 h"
    assert p.output_tokens == pytest.approx(913_786 * 2306)
    assert p.gpu_hours == pytest.approx(7 * p.hours)
    assert p.cost == pytest.approx(7 * p.hours * 4.5)
    with pytest.raises(ValueError):
        makespan.from_rates(prompts=1, requests_per_s=0, output_tokens=1, gpus=1,
                            gpu_hour_cost=1)
