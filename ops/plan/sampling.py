"""Which prompts the plan measures: a stratified sample (stratum = source file
x category, the producer's buckets), so tool and multi-turn prompts are in the
sample in their share of the dataset, and a small source is not missed.

Deterministic: the same counts, size and seed always pick the same prompts.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence


def allocate(counts: Sequence[int], n: int) -> list[int]:
    """Sample size per stratum, summing to min(n, total).

    Every non-empty stratum gets at least one when n allows it (else the n
    largest get one each); the rest goes by largest shortfall against the
    proportional share n * count / total, never above a stratum's count.
    """
    total = sum(counts)
    n = min(max(n, 0), total)
    sizes = [0] * len(counts)
    if n == 0:
        return sizes
    nonempty = [h for h, c in enumerate(counts) if c > 0]
    if n < len(nonempty):
        for h in sorted(nonempty, key=lambda h: (-counts[h], h))[:n]:
            sizes[h] = 1
        return sizes
    for h in nonempty:
        sizes[h] = 1
    quota = [n * c / total for c in counts]
    # heap of (-(quota - size), stratum): the largest shortfall first
    heap = [(-(quota[h] - 1), h) for h in nonempty if counts[h] > 1]
    heapq.heapify(heap)
    left = n - len(nonempty)
    while left > 0:
        _, h = heapq.heappop(heap)
        sizes[h] += 1
        left -= 1
        if sizes[h] < counts[h]:
            heapq.heappush(heap, (-(quota[h] - sizes[h]), h))
    return sizes


def choose(count: int, k: int, seed: int, stratum: int) -> list[int]:
    """k distinct positions out of `count`, ascending; each stratum draws
    from its own seeded generator, so strata do not disturb each other."""
    rng = random.Random(f"tokenmill-plan:{seed}:{stratum}")
    return sorted(rng.sample(range(count), k))


def stratified(counts: Sequence[int], n: int, seed: int) -> list[list[int]]:
    """Positions to sample in each stratum."""
    return [choose(c, k, seed, h) for h, (c, k) in enumerate(zip(counts, allocate(counts, n),
                                                                  strict=True))]
