"""Throughput per concurrency level from whole requests, and the curve fit.

The rates are checked against a small processor-sharing server written here
(independent of tokenmill's makespan simulation): a closed loop holds each
level's concurrency, requests cross level boundaries, the last ones drain,
and the server queues requests beyond its running limit.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.plan.fit import SHARPNESS, fit_curve
from ops.plan.rates import Span, level_rates, level_weights, nnls
from schemas.plan import Curve
from tokenmill.forecast.throughput import concurrency_for_share, tokens_per_s


def sweep_spans(levels: list[int], hold: float, per_request: float, cap: float,  # noqa: C901
                max_running: int, seed: int = 0, median: float = 300.0,
                prefill: float = 0.0) -> tuple[list[Span], list[float]]:
    """A closed-loop sweep against a server where each decoding request gets
    min(per_request, cap / decoding) tokens/s, at most `max_running` run (FIFO
    queue beyond), after a fixed `prefill` delay; then a drain. Also returns
    the server's own tokens/s during each level (the ground truth)."""
    rng = random.Random(seed)
    t = 0.0
    produced = 0.0
    spans: list[Span] = []
    running: list[list[float]] = []  # [remaining tokens, start, tokens, prefill left]
    queue: list[list[float]] = []

    def launch() -> None:
        n = max(1, int(rng.lognormvariate(math.log(median), 0.6)))
        job = [float(n), t, float(n), prefill]
        (running if len(running) < max_running else queue).append(job)

    def advance(until: float, target: int | None) -> None:
        nonlocal t, produced
        while True:
            if target is not None:
                while len(running) + len(queue) < target:
                    launch()
            if not running:
                return
            decoding = [j for j in running if j[3] <= 0]
            rate = min(per_request, cap / len(decoding)) if decoding else 0.0
            steps = [j[0] / rate for j in decoding] if rate else []
            steps += [j[3] for j in running if j[3] > 0]
            dt = min(steps)
            if t + dt > until:
                dt = until - t
            for j in running:
                if j[3] > 0:
                    j[3] -= dt
                else:
                    j[0] -= rate * dt
            produced += rate * dt * len(decoding)
            t += dt
            for j in [j for j in running if j[0] <= 1e-9]:
                running.remove(j)
                spans.append(Span(j[1], t, int(j[2])))
                if queue:
                    running.append(queue.pop(0))
            if t >= until - 1e-12:
                return

    truth = []
    for level in levels:
        before = produced
        advance(t + hold, level)
        truth.append((produced - before) / hold)
    advance(math.inf, None)
    return spans, truth


@pytest.mark.parametrize("cap,max_running", [(800.0, 64), (800.0, 24), (math.inf, 16)])
def test_level_rates_recover_the_servers_throughput(cap: float, max_running: int) -> None:
    levels = [1, 2, 4, 8, 16, 32, 64]
    spans, truth = sweep_spans(levels, hold=60.0, per_request=40.0, cap=cap,
                               max_running=max_running)
    measured = level_rates(spans, levels).throughput(levels)
    for c, t, m in zip(levels, truth, measured, strict=True):
        # the server's own count, and what its capacity says
        assert t == pytest.approx(min(min(c, max_running) * 40.0, cap), rel=0.02)
        assert m == pytest.approx(t, rel=0.05), c


def test_queueing_and_prefill_do_not_inflate_the_rates() -> None:
    # plain least squares overstates throughput when part of a request's
    # time carries no tokens (queue, prefill); weighting by 1/duration does not
    levels = [8, 32, 64]
    spans, truth = sweep_spans(levels, hold=150.0, per_request=40.0, cap=640.0, max_running=16,
                               prefill=2.0)
    measured = level_rates(spans, levels).throughput(levels)
    assert truth[2] < 600  # 16 slots, each prefilling part of the time
    for t, m in zip(truth, measured, strict=True):
        assert m == pytest.approx(t, rel=0.05)


def test_progress_of_a_request_is_rate_times_exposure() -> None:
    levels = [1, 4]
    spans, _ = sweep_spans(levels, hold=100.0, per_request=10.0, cap=math.inf, max_running=8)
    rates = level_rates(spans, levels)
    first = spans[0]
    assert rates.progress(first.start, first.end) == pytest.approx(first.tokens, rel=0.05)


@given(st.integers(1, 2000), st.lists(st.integers(1, 512), min_size=1, max_size=10, unique=True))
def test_level_weights_are_exact_in_both_regimes(m: int, raw: list[int]) -> None:
    levels = sorted(raw)
    weights = level_weights(m, levels)
    assert all(w >= 0 for _, w in weights)
    # linear regime, every level's per-request rate r: r(m) = r (up to the top level)
    if m <= levels[-1]:
        assert sum(w for _, w in weights) == pytest.approx(1.0)
    # plateau, every level's throughput T, so r_k = T / c_k: r(m) = T / m (from the lowest)
    if m >= levels[0]:
        assert sum(w / levels[k] for k, w in weights) == pytest.approx(1.0 / m)


@settings(max_examples=50)
@given(st.lists(st.lists(st.floats(-10, 10), min_size=3, max_size=3), min_size=3, max_size=12),
       st.lists(st.floats(-100, 100), min_size=12, max_size=12))
def test_nnls_solves_the_constrained_problem(rows: list[list[float]], ys: list[float]) -> None:
    y = ys[:len(rows)]
    a = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    b = [sum(r[i] * v for r, v in zip(rows, y, strict=True)) for i in range(3)]
    x = nnls(a, b)
    assert all(v >= 0 for v in x)

    def loss(v: list[float]) -> float:
        return sum((sum(r[i] * v[i] for i in range(3)) - t) ** 2 for r, t in zip(rows, y,
                                                                                 strict=True))

    # no non-negative point nearby does better (KKT, checked by perturbation)
    for i in range(3):
        for step in (1e-3, -1e-3):
            moved = list(x)
            moved[i] = max(0.0, moved[i] + step)
            assert loss(x) <= loss(moved) + 1e-6 * (1 + loss(x))


# ------------------------------------------------------------------ the fit

LEVELS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


@settings(max_examples=60, deadline=None)
@given(st.floats(100, 1e5), st.floats(2, 100), st.sampled_from(SHARPNESS))
def test_fit_recovers_a_known_saturating_curve(plateau: float, knee: float,
                                               sharpness: float) -> None:
    truth = Curve(max_tokens_per_s=plateau, knee=knee, sharpness=sharpness)
    points = [(c, tokens_per_s(truth, c), 1.0) for c in LEVELS]
    fitted = fit_curve(points)
    for c in LEVELS:
        assert tokens_per_s(fitted, c) == pytest.approx(tokens_per_s(truth, c), rel=0.01)
    # the knee (95% of the plateau) lands where the true one is
    assert concurrency_for_share(fitted) == pytest.approx(concurrency_for_share(truth), rel=0.1)


def test_fit_tolerates_measurement_noise() -> None:
    truth = Curve(max_tokens_per_s=3600.0, knee=48.0, sharpness=8.0)
    rng = random.Random(4)
    points = [(c, tokens_per_s(truth, c) * rng.uniform(0.97, 1.03), 1.0) for c in LEVELS]
    fitted = fit_curve(points)
    assert fitted.max_tokens_per_s == pytest.approx(3600.0, rel=0.04)
    assert concurrency_for_share(fitted) == pytest.approx(concurrency_for_share(truth), rel=0.2)


def test_fit_needs_two_levels() -> None:
    with pytest.raises(ValueError, match="two concurrency levels"):
        fit_curve([(8, 100.0, 1.0), (16, 0.0, 1.0)])
