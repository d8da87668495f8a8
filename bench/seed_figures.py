"""The figure computations of bench/bench_seed_run.py: small pure functions
over time series, so each can be tested without a broker.

A series is a list of (t, value) samples, t in epoch seconds, in time order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

Series = Sequence[tuple[float, float]]

MIDDLE = 0.8  # the steady state: the middle 80% of a side's run
FLAT_FROM = 0.1  # RSS is compared with its value at 10% of the run
FLAT_LIMIT = 1.1  # end <= 1.1 x the value at 10%


def middle_window(start: float, end: float, share: float = MIDDLE) -> tuple[float, float]:
    """The middle `share` of [start, end]: (start + margin, end - margin)."""
    if end < start or not 0.0 < share <= 1.0:
        raise ValueError("need start <= end and 0 < share <= 1")
    margin = (end - start) * (1.0 - share) / 2
    return start + margin, end - margin


def within(series: Series, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(t, v) for t, v in series if lo <= t <= hi]


def busy_share(running: Series, cap: int, lo: float, hi: float) -> float:
    """Mean of running / cap over the samples in [lo, hi] (NaN without any):
    the share of the server's request slots that held a request."""
    if cap <= 0:
        raise ValueError("cap must be > 0")
    values = [min(v / cap, 1.0) for _, v in within(running, lo, hi)]
    return sum(values) / len(values) if values else math.nan


def value_at(series: Series, t: float) -> float:
    """The value of the sample nearest to t (NaN for an empty series)."""
    if not series:
        return math.nan
    return min(series, key=lambda s: abs(s[0] - t))[1]


def growth(series: Series, start: float, end: float, at: float = FLAT_FROM) -> float:
    """Last value (at or before `end`) / value at `at` of [start, end]: RSS
    growth after the warm-up (NaN when the series has no sample there)."""
    kept = [s for s in series if s[0] <= end]
    if not kept:
        return math.nan
    early = value_at(kept, start + (end - start) * at)
    return kept[-1][1] / early if early else math.nan


def slope_per_hour(series: Series, after: float) -> float:
    """Least-squares slope of the samples at or after `after`, per hour
    (NaN with fewer than two samples or no time spread)."""
    points = [(t, v) for t, v in series if t >= after]
    n = len(points)
    if n < 2:
        return math.nan
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return math.nan
    cov = sum((t - mt) * (v - mv) for t, v in points)
    return cov / var * 3600.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (NaN if empty)."""
    if not values:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError("q must be within [0, 100]")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def rates(counter: Series) -> list[tuple[float, float]]:
    """Per-second rate between consecutive samples of a counter, stamped at
    the interval's end (a counter that went down, a restart, gives 0)."""
    out = []
    for (t0, v0), (t1, v1) in zip(counter, counter[1:]):
        if t1 > t0:
            out.append((t1, max(v1 - v0, 0.0) / (t1 - t0)))
    return out


def first_rise(counter: Series, since: float) -> float | None:
    """Time of the first sample after `since` whose value is above the last
    value seen at or before `since` (None when it never rises)."""
    before = [v for t, v in counter if t <= since]
    base = before[-1] if before else (counter[0][1] if counter else 0.0)
    return next((t for t, v in counter if t > since and v > base), None)


def last_rise(counter: Series) -> float | None:
    """Time of the last sample whose value is above the one before it."""
    out = None
    for (_, v0), (t1, v1) in zip(counter, counter[1:]):
        if v1 > v0:
            out = t1
    return out


def at_fractions(total: int, fractions: Sequence[float]) -> list[int]:
    """The counts at which each fraction of `total` is reached (at least 1)."""
    return [max(1, math.ceil(total * f)) for f in fractions]


def lost_and_duplicated(published: Iterable[str], seen: Iterable[str]) -> tuple[int, int, int]:
    """(lost, duplicated, unknown): published ids never seen, extra sightings
    of ids seen more than once, and seen ids that were never published."""
    counts = Counter(seen)
    wanted = set(published)
    lost = sum(1 for i in wanted if i not in counts)
    duplicated = sum(c - 1 for c in counts.values() if c > 1)
    unknown = sum(1 for i in counts if i not in wanted)
    return lost, duplicated, unknown
