"""The lineage index against a brute-force model of every prompt's fate in
every run (property tests), and the lineage rules on specs."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.dataset.index import PENDING, LineageIndex, RunFacts
from ops.dataset.lineage import AmbiguousLineage, LineageError, kind_of, lineage
from schemas import GenerationSettings, Origin, RunSpec

OUTCOMES = ("accepted", "length", "empty", "trivial", "failed")


def simulate(n: int, plan: list[tuple[str, frozenset[str]]], seed: int,
             last_incomplete: bool) -> tuple[list[RunFacts], list[list[tuple[str, str]]],
                                             list[dict[str, str]]]:
    """Runs as the model says: each held prompt gets an outcome per run;
    the last run may leave some prompts pending."""
    rng = random.Random(seed)
    ids = [f"{i:032x}" for i in range(n)]
    outcomes: list[dict[str, str]] = []
    facts: list[RunFacts] = []
    letters: list[list[tuple[str, str]]] = []
    for k, (kind, reasons) in enumerate(plan):
        if kind == "produce":
            held = list(ids)
        elif kind == "replay":
            held = list(outcomes[-1])
        else:
            held = [pid for pid, o in outcomes[-1].items() if o in reasons]
        incomplete = last_incomplete and k == len(plan) - 1
        mine = {}
        for pid in held:
            outcome = rng.choice(OUTCOMES + (("pending",) * 2 if incomplete else ()))
            mine[pid] = outcome
        outcomes.append(mine)
        dlq = [(pid, o) for pid, o in mine.items() if o not in ("accepted", "pending")]
        rng.shuffle(dlq)
        letters.append(dlq)
        facts.append(RunFacts(
            run_id=f"r{k}", kind=kind, reasons=reasons, complete=not incomplete,
            prompts=len(held), accepted=sum(o == "accepted" for o in mine.values())))
    return facts, letters, outcomes


def indexed(n: int, steps: list[tuple[str, frozenset[str]]], seed: int, last_incomplete: bool
            ) -> tuple[LineageIndex, list[dict[str, str]]]:
    """The model's lineage of a produced run and `steps`, fed to an index."""
    facts, letters, outcomes = simulate(n, [("produce", frozenset())] + steps, seed,
                                        last_incomplete)
    index = LineageIndex(facts)
    for dlq in letters:
        index.add_run(dlq)
    return index, outcomes


def expected_winner(pid: str, outcomes: list[dict[str, str]]) -> int | None:
    won = [k for k, o in enumerate(outcomes) if o.get(pid) == "accepted"]
    return won[-1] if won else None


reasons_st = st.frozensets(st.sampled_from(OUTCOMES[1:]), min_size=1)
plan_st = st.lists(st.one_of(st.just(("replay", frozenset())),
                             reasons_st.map(lambda r: ("redrive", r))), max_size=4)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), steps=plan_st, seed=st.integers(0, 10_000))
def test_complete_lineage_matches_the_model(n, steps, seed) -> None:
    index, outcomes = indexed(n, steps, seed, last_incomplete=False)
    summary = index.summary()
    clean = index.clean_winner()
    ids = [f"{i:032x}" for i in range(n)]
    winners = {pid: expected_winner(pid, outcomes) for pid in ids}
    assert {pid: index.winner(pid, clean) for pid in ids} == winners
    by_run = Counter(w for w in winners.values() if w is not None)
    assert [t.winners for t in summary.runs] == [by_run[k] for k in range(len(outcomes))]
    assert summary.exact and summary.covered_low == sum(by_run.values())
    without: Counter[tuple[str, str]] = Counter()
    for pid in ids:
        if winners[pid] is None:
            last = max(k for k, o in enumerate(outcomes) if pid in o)
            without[(f"r{last}", outcomes[last][pid])] += 1
    assert summary.without == without
    assert [t.holds for t in summary.runs] == [len(o) for o in outcomes]
    assert not summary.anomalies


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 60), steps=plan_st, seed=st.integers(0, 10_000))
def test_an_unfinished_last_run_bounds_the_coverage(n, steps, seed) -> None:
    index, outcomes = indexed(n, steps, seed, last_incomplete=True)
    summary = index.summary()
    truth = sum(expected_winner(f"{i:032x}", outcomes) is not None for i in range(n))
    assert summary.covered_low <= truth <= summary.covered_high
    if all(kind == "redrive" for kind, _ in steps):
        assert summary.exact  # a redrive's prompts have no result elsewhere
    pending = sum(count for (_, reason), count in summary.without.items() if reason == PENDING)
    assert pending == sum(1 for pid, o in outcomes[-1].items() if o in ("accepted", "pending")
                          and expected_winner(pid, outcomes[:-1]) is None)


def test_redrive_chain_counts_each_part() -> None:
    ids = [f"{i:032x}" for i in range(10)]
    facts = [RunFacts("root", "produce", prompts=10, accepted=6),
             RunFacts("r8k", "redrive", frozenset({"length"}), prompts=3, accepted=2),
             RunFacts("r16k", "redrive", frozenset({"length"}), prompts=1, accepted=0)]
    index = LineageIndex(facts)
    index.add_run([(ids[0], "length"), (ids[1], "length"), (ids[2], "length"),
                   (ids[3], "empty")])
    index.add_run([(ids[1], "length")])
    index.add_run([(ids[1], "length")])
    summary = index.summary()
    assert [t.winners for t in summary.runs] == [6, 2, 0]
    assert summary.covered_low == summary.covered_high == 8
    assert summary.without == {("root", "empty"): 1, ("r16k", "length"): 1}
    clean = index.clean_winner()
    assert index.winner(ids[9], clean) == 0 and index.winner(ids[0], clean) == 1
    assert index.winner(ids[1], clean) is None


def test_a_dead_letter_the_run_cannot_hold_is_reported() -> None:
    index = LineageIndex([RunFacts("root", "produce", prompts=2),
                          RunFacts("rd", "redrive", frozenset({"length"}), prompts=1)])
    index.add_run([("a" * 32, "length")])
    index.add_run([("b" * 32, "empty")])  # b was accepted by the root, never redriven
    assert any("does not hold" in m for m in index.summary().anomalies)


def spec(run_id: str, parent: str | None = None, kind: str = "produce",
         reasons: tuple[str, ...] = ()) -> RunSpec:
    return RunSpec(run_id=run_id, partitions=2, generation=GenerationSettings(),
                   parent_run=parent, origin=Origin(kind=kind, reasons=reasons),  # type: ignore[arg-type]
                   prompts_topic=f"tokenmill.{parent}.prompts" if kind == "replay" else None)


def test_lineage_runs_from_the_root_through_single_children() -> None:
    specs = {s.run_id: s for s in (
        spec("root"), spec("a", "root", "redrive", ("length",)),
        spec("b", "a", "redrive", ("length",)), spec("other", "root", "produce"))}
    assert [s.run_id for s in lineage(specs, "root")] == ["root", "a", "b"]
    assert [s.run_id for s in lineage(specs, "a")] == ["root", "a", "b"]
    assert [s.run_id for s in lineage(specs, "other")] == ["other"]  # files of its own


def test_a_branching_lineage_asks_which_branch() -> None:
    specs = {s.run_id: s for s in (
        spec("root"), spec("a", "root", "redrive", ("length",)), spec("b", "root", "replay"))}
    with pytest.raises(AmbiguousLineage, match="a, b"):
        lineage(specs, "root")
    assert [s.run_id for s in lineage(specs, "b")] == ["root", "b"]
    with pytest.raises(LineageError):
        lineage(specs, "nope")


def test_a_replay_registered_before_origin_existed_is_a_replay() -> None:
    legacy = RunSpec(run_id="c", partitions=2, parent_run="p", prompts_topic="tokenmill.p.prompts")
    assert kind_of(legacy) == "replay"
    with pytest.raises(ValueError):
        Origin(kind="redrive")
    with pytest.raises(ValueError):
        RunSpec(run_id="x", partitions=1, origin=Origin(kind="replay"))
