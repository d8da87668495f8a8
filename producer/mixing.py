"""The deterministic publish order: every stretch of every partition carries
the whole mix of sources and categories.

Records are grouped in buckets (source file x category), counted in pass 1.

1. Quotas: bucket records are dealt round-robin over partitions with one
   global counter, so partition totals differ by at most one and each
   bucket's share of each partition differs by at most one.
2. Within a partition, buckets are interleaved smoothly: at each position,
   among the buckets that are behind their ideal share, the one whose next
   record is due soonest goes (earliest deadline first). Every prefix of a
   partition then holds each bucket within one record of its exact share.
3. The global order visits partitions round-robin (seq % P). Because the
   mixing is done per partition, not over a global sequence later cut by
   seq % P, periodic patterns cannot alias (a 50/50 alternation over two
   partitions would otherwise put every A on partition 0).

Any record of a bucket will do for its slot, so publishing needs only one
sequential reader per bucket.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence


def partition_quotas(bucket_counts: Sequence[int], partitions: int) -> list[list[int]]:
    """quotas[p][b]: records of bucket b that go to partition p."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    quotas = [[0] * len(bucket_counts) for _ in range(partitions)]
    counter = 0  # global dealing position; record i of the deal goes to i % P
    for b, count in enumerate(bucket_counts):
        base, extra = divmod(count, partitions)
        for p in range(partitions):
            quotas[p][b] = base
        for i in range(extra):
            quotas[(counter + i) % partitions][b] += 1
        counter += count
    return quotas


def smooth_order(quota: Sequence[int]) -> Iterator[int]:
    """Bucket index for each position of one partition.

    Bucket b's k-th record (0-based) is *released* at position floor(k*Q/q_b)
    and *due* by (k+1)*Q/q_b; among released records the earliest due goes
    first, ties to the lower bucket index. O(log B) per record."""
    total = sum(quota)
    waiting: list[tuple[int, int]] = []  # (release position, bucket)
    ready: list[tuple[float, int]] = []  # (deadline, bucket); deadlines compare exactly
    emitted = [0] * len(quota)
    for b, q in enumerate(quota):
        if q > 0:
            waiting.append((0, b))
    heapq.heapify(waiting)
    for t in range(total):
        while waiting and waiting[0][0] <= t:
            _, b = heapq.heappop(waiting)
            heapq.heappush(ready, ((emitted[b] + 1) / quota[b], b))
        _, b = heapq.heappop(ready)
        yield b
        k = emitted[b] = emitted[b] + 1
        if k < quota[b]:
            heapq.heappush(waiting, ((k * total) // quota[b], b))


def partition_sizes(total: int, partitions: int) -> list[int]:
    """Records per partition under round-robin: the first total % P get one more."""
    base, extra = divmod(total, partitions)
    return [base + (1 if p < extra else 0) for p in range(partitions)]


def publish_order(bucket_counts: Sequence[int], partitions: int) -> Iterator[tuple[int, int]]:
    """(partition, bucket) for seq = 0, 1, 2, ... of the whole run."""
    quotas = partition_quotas(bucket_counts, partitions)
    orders = [smooth_order(q) for q in quotas]
    sizes = [sum(q) for q in quotas]
    total = sum(sizes)
    assert sizes == partition_sizes(total, partitions)
    for seq in range(total):
        p = seq % partitions
        yield p, next(orders[p])
