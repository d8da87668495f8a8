"""Output tokens/s at each concurrency level, from whole requests only.

A non-streaming request tells its token count once, at the end, and at real
GPU speeds most requests outlive a level of the sweep. So each level's rate
is not counted but solved for. The server shares its speed among the requests
in flight (each decode step gives every running request a token), so a
request that was in flight for d_k seconds while the sweep held level k
received about sum_k r_k * d_k tokens, r_k being the per-request rate at that
level. With many requests that is a linear system in r_k, solved by
non-negative least squares, each request weighted by 1/its duration (for a
single level that is Little's law: tokens received / request-seconds in
flight); the level's throughput is T_k = c_k * r_k.

Between levels (while the last requests drain) m requests are in flight with
m not a level: the rate there is interpolated, T linear in m between the
neighbouring levels, which is exact both where T grows linearly and on the
plateau. Below the lowest level the per-request rate is that level's.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-12


@dataclass(frozen=True)
class Span:
    """One request in flight from `start` to `end` (seconds); `tokens` is its
    output when it finished, None when it did not (failed or cut short)."""

    start: float
    end: float
    tokens: int | None


def level_weights(m: int, levels: Sequence[int]) -> list[tuple[int, float]]:
    """(level index, weight) with per-request rate r(m) = sum w * r_level."""
    if m <= 0:
        return []
    if m <= levels[0]:
        return [(0, 1.0)]
    last = len(levels) - 1
    if m >= levels[last]:
        return [(last, levels[last] / m)]
    j = bisect.bisect_right(levels, m) - 1
    lo, hi = levels[j], levels[j + 1]
    t = (m - lo) / (hi - lo)
    return [(j, (1 - t) * lo / m), (j + 1, t * hi / m)]


class Timeline:
    """In-flight count over time, and per-level integrals of the weights, so
    a request's design row is two lookups per level."""

    def __init__(self, spans: Sequence[Span], levels: Sequence[int]) -> None:
        changes: dict[float, int] = {}
        for s in spans:
            changes[s.start] = changes.get(s.start, 0) + 1
            changes[s.end] = changes.get(s.end, 0) - 1
        self.times = sorted(changes)
        self.levels = list(levels)
        k = len(levels)
        self._cumulative: list[list[float]] = [[0.0] * k]
        self.in_flight: list[int] = []
        m = 0
        for i, t in enumerate(self.times):
            m += changes[t]
            self.in_flight.append(m)
            row = list(self._cumulative[-1])
            if i + 1 < len(self.times):
                duration = self.times[i + 1] - t
                for level, w in level_weights(m, levels):
                    row[level] += duration * w
                self._cumulative.append(row)

    def row(self, start: float, end: float) -> list[float]:
        """Seconds-weighted exposure of a request in flight over [start, end]."""
        a = bisect.bisect_left(self.times, start)
        b = bisect.bisect_left(self.times, end)
        lo, hi = self._cumulative[a], self._cumulative[b]
        return [high - low for high, low in zip(hi, lo, strict=True)]

    def level_request_seconds(self) -> list[float]:
        """In-flight request-seconds attributed to each level (the evidence)."""
        out = [0.0] * len(self.levels)
        for i in range(len(self.times) - 1):
            m = self.in_flight[i]
            duration = self.times[i + 1] - self.times[i]
            for level, w in level_weights(m, self.levels):
                out[level] += duration * w * m
        return out


def nnls(a: list[list[float]], b: list[float], iterations: int = 100) -> list[float]:
    """min |Xr - y|^2 subject to r >= 0, given the normal equations
    a = X'X, b = X'y (Lawson-Hanson active set; the systems here are small)."""
    n = len(b)
    tolerance = 1e-10 * max((abs(v) for v in b), default=0.0)
    x = [0.0] * n
    passive: set[int] = set()
    for _ in range(iterations):
        gradient = [b[i] - sum(a[i][j] * x[j] for j in range(n)) for i in range(n)]
        free = [i for i in range(n) if i not in passive and gradient[i] > tolerance]
        if not free:
            break
        passive.add(max(free, key=lambda i: gradient[i]))
        while passive:
            z = _solve_subset(a, b, sorted(passive))
            blocking = [i for i in passive if z[i] <= 0]
            if not blocking:
                x = z
                break
            # move towards z until the first variable reaches zero; drop it
            alpha = min((x[i] / (x[i] - z[i]) if x[i] - z[i] > _EPS else 0.0) for i in blocking)
            x = [x[i] + alpha * (z[i] - x[i]) for i in range(n)]
            passive = {i for i in passive if x[i] > _EPS}
    return [max(v, 0.0) for v in x]


def _solve_subset(a: list[list[float]], b: list[float], subset: list[int]) -> list[float]:
    """Least squares restricted to `subset` (Gaussian elimination with partial
    pivoting on the sub-system; a tiny ridge keeps it solvable)."""
    n = len(b)
    k = len(subset)
    scale = max((a[i][i] for i in subset), default=1.0) or 1.0
    m = [[a[i][j] + (scale * 1e-12 if i == j else 0.0) for j in subset] + [b[i]] for i in subset]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < _EPS:
            continue
        for r in range(col + 1, k):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, k + 1):
                    m[r][c] -= f * m[col][c]
    z = [0.0] * k
    for r in range(k - 1, -1, -1):
        if abs(m[r][r]) < _EPS:
            continue
        z[r] = (m[r][k] - sum(m[r][c] * z[c] for c in range(r + 1, k))) / m[r][r]
    out = [0.0] * n
    for i, value in zip(subset, z, strict=True):
        out[i] = value
    return out


@dataclass(frozen=True)
class LevelRates:
    per_request: list[float]  # r_k, output tokens/s of one request at level k
    request_seconds: list[float]
    timeline: Timeline

    def throughput(self, levels: Sequence[int]) -> list[float]:
        return [c * r for c, r in zip(levels, self.per_request, strict=True)]

    def progress(self, start: float, end: float) -> float:
        """Tokens a request in flight over [start, end] most likely received."""
        return sum(w * r for w, r in zip(self.timeline.row(start, end), self.per_request,
                                         strict=True))


def level_rates(spans: Sequence[Span], levels: Sequence[int]) -> LevelRates:
    """Per-request output rate at each level, from every request's span (all
    spans shape the in-flight count; finished ones carry the evidence).

    One physical constraint regularizes it: a request never decodes faster
    because more requests share the server, so r_1 >= r_2 >= ... >= 0. That
    is solved as non-negative least squares on the steps between levels
    (r_k = sum of steps d_j for j >= k), and it keeps short, overlapping
    low levels from trading tokens between each other."""
    if list(levels) != sorted(set(levels)) or not levels or levels[0] < 1:
        raise ValueError("levels must be ascending, distinct and >= 1")
    timeline = Timeline(spans, levels)
    k = len(levels)
    a = [[0.0] * k for _ in range(k)]
    b = [0.0] * k
    for s in spans:
        if s.tokens is None or s.end <= s.start:
            continue
        # weight 1/duration: at a single level this is sum(tokens) /
        # sum(in-flight time), Little's law, unbiased even when part of a
        # request's time is queueing or prefill (plain least squares is not)
        weight = 1.0 / (s.end - s.start)
        exposure = timeline.row(s.start, s.end)
        # columns for the steps: step j adds to the rates of levels 0..j
        row = list(itertools.accumulate(exposure))
        for i in range(k):
            if row[i]:
                b[i] += weight * row[i] * s.tokens
                for j in range(k):
                    a[i][j] += weight * row[i] * row[j]
    steps = nnls(a, b)
    per_request = list(itertools.accumulate(reversed(steps)))[::-1]
    return LevelRates(per_request, timeline.level_request_seconds(), timeline)
