"""The plan's sample: stratified by source and category, deterministic with a
seed, and drawn from exactly the prompts `produce` would publish."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ops.plan.dataset import read_sample
from ops.plan.sampling import allocate, choose, stratified
from producer.ingest import IngestOptions, ingest
from producer.inputs import resolve
from producer.rejects import RejectsFile
from producer.spool import SpoolWriter

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "devstack" / "sample"
FILES = sorted(SAMPLE_DIR.iterdir())

counts_strategy = st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=40)


@given(counts_strategy, st.integers(min_value=0, max_value=20000))
def test_allocation_sums_and_bounds(counts: list[int], n: int) -> None:
    sizes = allocate(counts, n)
    assert sum(sizes) == min(n, sum(counts))
    assert all(0 <= k <= c for k, c in zip(sizes, counts, strict=True))


@given(counts_strategy, st.integers(min_value=0, max_value=20000))
def test_every_stratum_is_kept_when_the_sample_allows(counts: list[int], n: int) -> None:
    sizes = allocate(counts, n)
    nonempty = [h for h, c in enumerate(counts) if c]
    if n >= len(nonempty):
        assert all(sizes[h] >= 1 for h in nonempty)
    else:  # too small to keep them all: one each from the largest
        assert all(k in (0, 1) for k in sizes) and sum(sizes) == n


@given(counts_strategy, st.integers(min_value=1, max_value=20000))
def test_allocation_is_proportional(counts: list[int], n: int) -> None:
    total = sum(counts)
    sizes = allocate(counts, n)
    quota = [min(n, total) * c / total for c in counts] if total else [0.0] * len(counts)
    if all(q >= 1 or c == 0 for q, c in zip(quota, counts, strict=True)):
        # no stratum needed the minimum of one: plain largest remainders
        assert all(abs(k - q) < 1 for k, q in zip(sizes, quota, strict=True))
    else:  # the minimums cost the others at most one each, plus what they took
        extra = sum(1 - q for q, c in zip(quota, counts, strict=True) if 0 < q < 1 and c)
        assert all(k - q < 1 for k, q in zip(sizes, quota, strict=True) if q >= 1)
        assert all(q - k <= extra + 1 for k, q in zip(sizes, quota, strict=True))


@settings(max_examples=50)
@given(counts_strategy, st.integers(min_value=0, max_value=3000), st.integers())
def test_stratified_picks_are_deterministic_distinct_and_in_range(counts: list[int], n: int,
                                                                   seed: int) -> None:
    picks = stratified(counts, n, seed)
    assert picks == stratified(counts, n, seed)
    for chosen, count, size in zip(picks, counts, allocate(counts, n), strict=True):
        assert len(chosen) == size == len(set(chosen))
        assert chosen == sorted(chosen) and all(0 <= i < count for i in chosen)


def test_another_seed_picks_other_prompts() -> None:
    assert choose(10_000, 50, 1, 0) != choose(10_000, 50, 2, 0)
    assert choose(10_000, 50, 1, 0) != choose(10_000, 50, 1, 1)  # strata independent


def test_sample_comes_from_the_producers_own_buckets(tmp_path: Path) -> None:
    sample = read_sample(FILES, multi_turn="last-user", tools="structured", size=40, seed=7)
    # the same pass 1 as `produce`: identical counts per bucket
    sources = resolve(FILES)
    spool = SpoolWriter(tmp_path / "spool")
    rejects = RejectsFile(tmp_path / "rejects.jsonl")
    result = ingest(sources, IngestOptions(run="x", policy="last-user", tool_mode="structured"),
                    spool, rejects)
    spool.close()
    rejects.close()
    dataset = sample.dataset
    assert dataset.prompts == result.total
    assert [s.prompts for s in dataset.strata] == [c for c in result.bucket_counts if c]
    assert dataset.rejected == result.summary.rejected
    assert dataset.duplicates == result.summary.duplicates
    assert {s.category for s in dataset.strata} == {"plain", "system-prompt", "multi-turn",
                                                    "tools"}
    # every stratum is in the sample, in proportion, and each prompt is where it says
    assert sum(s.sampled for s in dataset.strata) == len(sample.prompts) == 40
    assert all(s.sampled >= 1 for s in dataset.strata)
    for s in dataset.strata:
        assert abs(s.sampled - 40 * s.prompts / dataset.prompts) < 1 + 1
    for p in sample.prompts:
        stratum = dataset.strata[p.stratum]
        assert (p.prompt.source, p.prompt.category) == (stratum.source, stratum.category)
    assert len({p.prompt.id for p in sample.prompts}) == 40


def test_sample_is_deterministic_with_a_seed() -> None:
    def ids(seed: int) -> list[str]:
        s = read_sample(FILES, multi_turn="last-user", tools="structured", size=25, seed=seed)
        return [p.prompt.id for p in s.prompts]

    assert ids(3) == ids(3)
    assert ids(3) != ids(4)


def test_a_sample_as_large_as_the_dataset_is_the_dataset() -> None:
    full = read_sample(FILES, multi_turn="strip-assistant", tools="as-given", size=10**6, seed=0)
    assert len(full.prompts) == full.dataset.prompts
    assert all(s.sampled == s.prompts for s in full.dataset.strata)
    assert full.dataset.multi_turn == "strip-assistant" and full.dataset.tools == "as-given"
    assert math.isclose(sum(s.prompts for s in full.dataset.strata), full.dataset.prompts)
