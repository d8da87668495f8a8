"""Fit the throughput curve (tokenmill/forecast/throughput.py) to the levels.

Least squares on relative error (a level at concurrency 1 counts as much as
one on the plateau), each level weighted by its evidence. For a fixed knee
and sharpness the plateau has a closed form, so the search is a grid over
the sharpness and a log grid over the knee, refined around each sharpness's
best knee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from schemas.plan import Curve
from tokenmill.forecast.throughput import shape

SHARPNESS = (0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)
KNEE_STEPS = 240


def _best_plateau(points: Sequence[tuple[float, float, float]], knee: float,
                  sharpness: float) -> tuple[float, float]:
    """(plateau, weighted squared relative error) for a fixed knee and sharpness."""
    num = den = 0.0
    g = []
    for c, t, w in points:
        gi = shape(c / knee, sharpness)
        g.append(gi)
        num += w * gi / t
        den += w * gi * gi / (t * t)
    if den <= 0:
        return 0.0, math.inf
    plateau = num / den
    error = sum(w * ((t - plateau * gi) / t) ** 2 for (c, t, w), gi in zip(points, g, strict=True))
    return plateau, error


def fit_curve(points: Sequence[tuple[float, float, float]]) -> Curve:
    """Curve through (concurrency, tokens/s, weight) points; points with no
    throughput or weight are ignored. Needs two points at least."""
    usable = [(float(c), float(t), float(w)) for c, t, w in points if t > 0 and w > 0 and c > 0]
    if len(usable) < 2:
        raise ValueError("need throughput at two concurrency levels at least")
    lo = min(c for c, _, _ in usable) / 16
    hi = max(c for c, _, _ in usable) * 16
    ratio = (hi / lo) ** (1 / KNEE_STEPS)
    best = (math.inf, 0.0, 1.0, 1.0)  # error, plateau, knee, sharpness
    for s in SHARPNESS:
        knees = [lo * ratio**i for i in range(KNEE_STEPS + 1)]
        errors = [_best_plateau(usable, knee, s)[1] for knee in knees]
        i = min(range(len(knees)), key=errors.__getitem__)
        knee = _refine(usable, s, knees[i] / ratio, knees[i] * ratio)
        plateau, error = _best_plateau(usable, knee, s)
        if error > errors[i]:
            knee = knees[i]
            plateau, error = _best_plateau(usable, knee, s)
        if error < best[0]:
            best = (error, plateau, knee, s)
    _, plateau, knee, s = best
    return Curve(max_tokens_per_s=plateau, knee=knee, sharpness=s)


def _refine(points: Sequence[tuple[float, float, float]], sharpness: float, lo: float,
            hi: float) -> float:
    """The best knee in [lo, hi] (golden section on log knee)."""
    a, b = math.log(lo), math.log(hi)
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        x1 = b - golden * (b - a)
        x2 = a + golden * (b - a)
        if (_best_plateau(points, math.exp(x1), sharpness)[1]
                <= _best_plateau(points, math.exp(x2), sharpness)[1]):
            b = x2
        else:
            a = x1
    return math.exp((a + b) / 2)
