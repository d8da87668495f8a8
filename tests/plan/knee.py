"""Where a calibration's measured rates put the knee, for the plan tests:
the plateau (the highest level's tokens/s) over one request's rate (the
lowest level's tokens/s per request in flight), the corner where the two
asymptotes of a server's throughput meet. On a loaded machine the
simulator's timers run late and both rates fall short of the configured
ones; the knee the plan fits is checked against this corner, measured in
the same sweep, not against the configured one."""

from __future__ import annotations

from collections.abc import Sequence

from schemas.plan import Level


def measured_corner(levels: Sequence[Level]) -> float:
    lowest, highest = levels[0], levels[-1]
    return highest.tokens_per_s / (lowest.tokens_per_s / lowest.concurrency)
