"""Answer lengths of a whole dataset, from a stratified sample of answers
generated once with the largest candidate budget M.

An answer that stopped by itself at t tokens is an exact length. One cut at M,
or still running when calibration ended at t tokens, only says "longer than
t": it is right-censored. The Kaplan-Meier estimator uses both without bias
(dropping the unfinished ones would favour short answers, since long ones are
the ones still running); with no censoring it is the plain empirical share.
Each stratum gets its own estimate, weighted by its share of the dataset.

Conventions (SGLang's): `tokens` counts every generated token, the end token
included; an answer needing L tokens is cut at budget m exactly when L > m,
and then yields m tokens.

* truncated_share(m) = P(L > m) = S(m)
* mean_output_tokens(m) = E[min(L, m)] = sum_{x=0}^{m-1} S(x)
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.plan import Answer


@dataclass(frozen=True)
class _Steps:
    """A right-continuous step function S(x) = P(L > x): `values[i]` holds on
    [times[i], times[i+1]); S = 1 before times[0]."""

    times: tuple[int, ...]
    values: tuple[float, ...]

    def at(self, x: float) -> float:
        i = bisect.bisect_right(self.times, x)
        return 1.0 if i == 0 else self.values[i - 1]

    def area(self, m: int) -> float:
        """sum_{x=0}^{m-1} S(x)."""
        total = 0.0
        previous, level = 0, 1.0
        for t, v in zip(self.times, self.values, strict=True):
            if t >= m:
                break
            total += (t - previous) * level
            previous, level = t, v
        return total + (m - previous) * level if m > previous else total


def kaplan_meier(answers: Sequence[Answer]) -> _Steps:
    """Survival steps of one stratum's answers (censored = not "stop")."""
    events: dict[int, int] = {}
    for a in answers:
        if a.outcome == "stop":
            events[a.tokens] = events.get(a.tokens, 0) + 1
    # at risk at t: every answer known to need >= t tokens (censored ones at t
    # are still running past t, so they count)
    tokens = sorted(a.tokens for a in answers)
    times: list[int] = []
    values: list[float] = []
    survival = 1.0
    for t in sorted(events):
        at_risk = len(tokens) - bisect.bisect_left(tokens, t)
        survival *= 1.0 - events[t] / at_risk
        times.append(t)
        values.append(survival)
    return _Steps(tuple(times), tuple(values))


class LengthDistribution:
    """Weighted mixture of per-stratum Kaplan-Meier estimates."""

    def __init__(self, answers: Sequence[Answer], weights: Mapping[int, float],
                 max_tokens: int) -> None:
        by_stratum: dict[int, list[Answer]] = {}
        for a in answers:
            by_stratum.setdefault(a.stratum, []).append(a)
        present = {s: w for s, w in weights.items() if w > 0 and s in by_stratum}
        total = sum(present.values())
        if not present or total <= 0:
            raise ValueError("no answers to estimate lengths from")
        self.max_tokens = max_tokens
        self._parts = [(w / total, kaplan_meier(by_stratum[s])) for s, w in sorted(present.items())]
        self.answers = len(answers)

    def _check(self, m: int) -> None:
        if m < 1 or m > self.max_tokens:
            raise ValueError(f"max_tokens {m} is outside what the sample measured "
                             f"(1..{self.max_tokens})")

    def truncated_share(self, m: int) -> float:
        """Share of answers cut at budget m."""
        self._check(m)
        return min(1.0, max(0.0, sum(w * s.at(m) for w, s in self._parts)))

    def mean_output_tokens(self, m: int) -> float:
        """Mean tokens per answer with budget m (cut answers count m)."""
        self._check(m)
        return sum(w * s.area(m) for w, s in self._parts)

    def quantiles(self, m: int, n: int) -> list[int]:
        """n output lengths under budget m at evenly spaced quantiles: a
        deterministic stand-in for the dataset's answers."""
        self._check(m)
        breakpoints = sorted({t for _, s in self._parts for t in s.times if t < m})
        cdf = [1.0 - sum(w * s.at(t) for w, s in self._parts) for t in breakpoints]
        out = []
        for i in range(n):
            u = (i + 0.5) / n
            j = bisect.bisect_left(cdf, u)
            out.append(breakpoints[j] if j < len(breakpoints) else m)
        return out
