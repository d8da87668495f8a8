"""How many requests to keep in flight.

A fixed cap, or `auto`: read SGLang's /metrics and hold a small, non-empty
server queue. An empty queue means the GPU may idle between batches; a long
one only adds latency and wasted work on a crash. The controller is a pure
function of the current limit and one metrics sample, so it is tested
without a server.
"""

from __future__ import annotations

import math

import msgspec


class ServerLoad(msgspec.Struct, frozen=True):
    running: float
    queued: float
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    accept_length: float | None = None


class AutoBounds(msgspec.Struct, frozen=True):
    minimum: int = 1
    maximum: int = 1024
    # Queue depth to hold: enough that the scheduler always has the next
    # request ready, small enough not to matter on a crash.
    target_queue_min: int = 2
    target_queue_fraction: float = 0.05
    # Above this KV-cache use, adding requests only causes retractions.
    max_token_usage: float = 0.92


METRIC_NAMES = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:token_usage": "token_usage",
    "sglang:gen_throughput": "gen_throughput",
    "sglang:spec_accept_length": "accept_length",
}


def parse_metrics(text: str) -> ServerLoad | None:
    """SGLang's Prometheus text -> load; None when the metrics are absent
    (server without --enable-metrics, or not SGLang). Sums over label sets."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name_end = line.find("{")
        space = line.rfind(" ")
        name = line[: name_end if name_end != -1 else line.find(" ")]
        field = METRIC_NAMES.get(name)
        if field is None:
            continue
        try:
            value = float(line[space + 1:])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        values[field] = values.get(field, 0.0) + value
    if "running" not in values or "queued" not in values:
        return None
    return ServerLoad(**values)


def target_queue(load: ServerLoad, bounds: AutoBounds) -> float:
    return max(bounds.target_queue_min, bounds.target_queue_fraction * load.running)


def next_limit(current: int, load: ServerLoad, in_flight: int, bounds: AutoBounds) -> int:
    """One control step.

    - queue below target and our requests fill the limit: grow (by a quarter,
      so a cold start reaches hundreds in a few steps);
    - queue above twice the target, or KV cache nearly full with a queue:
      shrink by the excess;
    - otherwise hold.
    """
    target = target_queue(load, bounds)
    saturated = in_flight >= current * 0.9
    if load.queued > 2 * target or (load.token_usage > bounds.max_token_usage and load.queued > 0):
        excess = load.queued - target
        proposed = current - max(1, int(excess / 2))
    elif load.queued < target and saturated and load.token_usage <= bounds.max_token_usage:
        proposed = current + max(1, current // 4, int(target - load.queued))
    else:
        proposed = current
    return max(bounds.minimum, min(bounds.maximum, proposed))
