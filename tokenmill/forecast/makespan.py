"""How long one GPU takes for its share of the prompts, and what a run costs.

A worker keeps `concurrency` requests in flight; all requests in flight
decode side by side (each gets T(m)/m tokens/s with m in flight, T the
server's throughput curve). Most of a long run is steady state, total tokens
/ T(concurrency); the end is not: the last answers finish with fewer
requests in flight, and the longest one alone sets the end. A short event
simulation of processor sharing gives both.

The run ends when its busiest GPU does. Each GPU gets an equal number of
prompts, but not an equal number of tokens: the sum of n answer lengths
varies by sd * sqrt(n), and the busiest of G GPUs is expected about
E[max of G standard normals] such deviations above the mean. That matters
for a run of a few thousand prompts (~2%) and vanishes for a million.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Callable, Sequence
from functools import cache

from schemas.plan import Prediction

SIMULATED_JOBS = 20_000  # beyond this, the steady state is added in closed form


def makespan_seconds(lengths: Sequence[float], jobs: int, concurrency: int,
                     rate: Callable[[int], float], seed: int = 0) -> float:
    """Seconds for `jobs` requests whose output lengths cycle through
    `lengths` (in a seeded shuffled order), with at most `concurrency` in
    flight; `rate(m)` is the server's output tokens/s with m in flight."""
    if jobs <= 0:
        return 0.0
    if not lengths or concurrency < 1:
        raise ValueError("need lengths and a concurrency >= 1")
    order = list(lengths)
    random.Random(seed).shuffle(order)
    steady = 0.0
    simulated = jobs
    if jobs > SIMULATED_JOBS:
        skipped = jobs - SIMULATED_JOBS
        mean = sum(order) / len(order)
        steady = skipped * mean / rate(concurrency)
        simulated = SIMULATED_JOBS
    clock = 0.0
    virtual = 0.0  # tokens each request in flight has received
    finishing: list[float] = []  # virtual finish points of requests in flight
    next_job = 0
    while next_job < simulated and len(finishing) < concurrency:
        heapq.heappush(finishing, virtual + order[next_job % len(order)])
        next_job += 1
    while finishing:
        m = len(finishing)
        per_request = rate(m) / m
        if per_request <= 0:
            raise ValueError(f"throughput with {m} in flight is not positive")
        first = finishing[0]
        clock += (first - virtual) / per_request
        virtual = first
        heapq.heappop(finishing)
        if next_job < simulated:
            heapq.heappush(finishing, virtual + order[next_job % len(order)])
            next_job += 1
    return steady + clock


@cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by numeric
    integration of x * n * pdf(x) * cdf(x)**(n-1)."""
    if n <= 1:
        return 0.0
    normal = statistics.NormalDist()
    step = 0.001
    return sum(x * n * normal.pdf(x) * normal.cdf(x) ** (n - 1) * step
               for x in (i * step for i in range(-8000, 8001)))


def busiest_gpu_lengths(lengths: Sequence[int], jobs: int, gpus: int) -> list[float]:
    """`lengths` scaled so that `jobs` of them add up to what the busiest of
    `gpus` GPUs is expected to get (see the module docstring)."""
    mean = statistics.fmean(lengths)
    if gpus <= 1 or jobs <= 0 or mean <= 0 or len(lengths) < 2:
        return list(map(float, lengths))
    excess = expected_max_normal(gpus) * statistics.pstdev(lengths) / (mean * math.sqrt(jobs))
    return [x * (1.0 + excess) for x in lengths]


def per_gpu_jobs(prompts: int, gpus: int) -> int:
    """The busiest GPU's share (partitions are balanced to within one)."""
    return math.ceil(prompts / gpus)


def prediction(*, max_tokens: int | None, truncated_share: float | None, prompts: int,
               output_tokens_per_prompt: float, seconds: float, gpus: int,
               gpu_hour_cost: float) -> Prediction:
    """A prediction row from a run's wall-clock seconds."""
    hours = seconds / 3600.0
    return Prediction(
        max_tokens=max_tokens, truncated_share=truncated_share,
        output_tokens_per_prompt=output_tokens_per_prompt,
        output_tokens=output_tokens_per_prompt * prompts,
        requests_per_s=prompts / seconds if seconds > 0 else 0.0,
        hours=hours, gpu_hours=hours * gpus, cost=hours * gpus * gpu_hour_cost)


def from_rates(*, prompts: int, requests_per_s: float, output_tokens: float, gpus: int,
               gpu_hour_cost: float) -> Prediction:
    """The operator's own figures (--estimate-rps for all GPUs together,
    --estimate-output-tokens per prompt) as hours, tokens and cost."""
    if requests_per_s <= 0:
        raise ValueError("requests/s must be > 0")
    return prediction(max_tokens=None, truncated_share=None, prompts=prompts,
                      output_tokens_per_prompt=output_tokens,
                      seconds=prompts / requests_per_s, gpus=gpus, gpu_hour_cost=gpu_hour_cost)
