"""A server's output tokens/s as a function of the requests it holds in flight.

    T(c) = Tmax * x / (1 + x**s) ** (1/s),   x = c / knee

grows linearly (every request decodes at full speed) well below the knee and
flattens to the plateau Tmax above it; the sharpness s says how abruptly (s=1
is the smooth Michaelis-Menten curve, large s the "roofline" of a server that
runs at full per-request speed until an aggregate limit). The knee is where
the two asymptotes meet.
"""

from __future__ import annotations

import math

from schemas.plan import Curve

# The knee: the concurrency where the curve reaches this share of the plateau.
KNEE_SHARE = 0.95
# The recommended concurrency: the knee plus this much (see recommended_concurrency).
HEADROOM = 1.25


def shape(x: float, sharpness: float) -> float:
    """x / (1 + x**s)**(1/s), computed without overflow."""
    if x <= 0:
        return 0.0
    log_xs = sharpness * math.log(x)
    if log_xs > 50:  # x**s dominates: ~ 1 - tiny
        return math.exp(-math.exp(-log_xs) / sharpness)
    # float ** float is typed Any (a negative base gives a complex); the base is > 0
    value: float = x / (1.0 + math.exp(log_xs)) ** (1.0 / sharpness)
    return value


def tokens_per_s(curve: Curve, concurrency: float) -> float:
    return curve.max_tokens_per_s * shape(concurrency / curve.knee, curve.sharpness)


def concurrency_for_share(curve: Curve, share: float = KNEE_SHARE) -> float:
    """The (real-valued) concurrency where T reaches `share` of the plateau."""
    # shape(x) = share  <=>  x**s / (1 + x**s) = share**s
    q: float = share ** curve.sharpness
    concurrency: float = curve.knee * (q / (1.0 - q)) ** (1.0 / curve.sharpness)
    return concurrency


def recommended_concurrency(curve: Curve, highest: int, share: float = KNEE_SHARE,
                            headroom: float = HEADROOM) -> tuple[int, int, bool]:
    """(knee, recommended, saturated).

    knee: the smallest whole concurrency reaching `share` of the plateau.
    recommended: the knee plus `headroom`: a client never refills a slot the
    instant an answer ends, so a few requests beyond the knee keep the server
    at its plateau (the consumer's auto mode keeps a small server queue for
    the same reason); more only queues on the server. Both are capped at the
    highest level measured; saturated says whether the knee was within it.
    """
    needed = max(1, math.ceil(concurrency_for_share(curve, share) - 1e-9))
    if needed > highest:
        return highest, highest, False
    return needed, min(highest, max(needed + 1, math.ceil(needed * headroom))), True
