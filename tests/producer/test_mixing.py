"""The publish-order scheduler: balance, per-partition mix, determinism."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from producer.mixing import partition_quotas, partition_sizes, publish_order, smooth_order

bucket_counts = st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=12)
partition_counts = st.integers(min_value=1, max_value=16)


@given(bucket_counts, partition_counts)
def test_quotas_are_balanced_overall_and_per_bucket(counts: list[int], partitions: int) -> None:
    quotas = partition_quotas(counts, partitions)
    totals = [sum(q) for q in quotas]
    assert max(totals) - min(totals) <= 1
    assert totals == partition_sizes(sum(counts), partitions)
    for b, count in enumerate(counts):
        shares = [q[b] for q in quotas]
        assert sum(shares) == count
        assert max(shares) - min(shares) <= 1


@given(st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=10))
@settings(max_examples=150)
def test_every_prefix_of_a_partition_holds_each_bucket_within_one(quota: list[int]) -> None:
    total = sum(quota)
    seen = [0] * len(quota)
    order = list(smooth_order(quota))
    assert Counter(order) == Counter({b: q for b, q in enumerate(quota) if q})
    for t, b in enumerate(order, start=1):
        seen[b] += 1
        for i, q in enumerate(quota):
            assert abs(seen[i] - t * q / total) < 1


@given(bucket_counts, partition_counts)
@settings(max_examples=60)
def test_publish_order_is_deterministic_and_round_robin(counts: list[int], partitions: int) -> None:
    first = list(publish_order(counts, partitions))
    assert first == list(publish_order(counts, partitions))
    assert [p for p, _ in first] == [seq % partitions for seq in range(sum(counts))]
    per_partition = Counter(p for p, _ in first)
    assert max(per_partition.values(), default=0) - min(per_partition.values(), default=0) <= 1


@given(st.integers(min_value=2, max_value=8), st.integers(min_value=1, max_value=60))
def test_no_aliasing_a_50_50_mix_reaches_every_partition(partitions: int, per_bucket: int) -> None:
    """A globally alternating A/B stream cut by seq % P would put all A on even
    partitions; per-partition mixing gives every partition both."""
    order = list(publish_order([per_bucket * partitions, per_bucket * partitions], partitions))
    for p in range(partitions):
        buckets = Counter(b for q, b in order if q == p)
        assert buckets[0] == buckets[1] == per_bucket


def test_a_small_bucket_is_spread_not_bunched() -> None:
    """One big file and a hundred tiny ones: the tiny ones spread over the partition."""
    order = list(smooth_order([1000] + [1] * 100))
    positions = [t for t, b in enumerate(order) if b != 0]
    gaps = [b - a for a, b in pairwise(positions)]
    assert max(gaps) <= 12 and min(gaps) >= 9
