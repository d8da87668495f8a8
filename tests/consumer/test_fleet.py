"""The fleet planner (consumer/fleet.py), pure: split, demand, donate, rates;
and a simulated fleet that shows shares converge to capacity and a mixed
fleet finishes close to a shared queue."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.fleet import (
    Decision,
    FleetView,
    Member,
    RateTracker,
    best_move,
    decide,
    fair_share,
    initial_slots,
    slot_name,
    worker_of,
)


def view(owners: dict[str, list[list[int]]], backlog: dict[int, int], *, at: float = 0.0,
         stable: bool = True, committed: dict[int, int] | None = None) -> FleetView:
    """owners: worker -> its slots' partitions; backlog: partition -> records left."""
    members = []
    for worker, slots in owners.items():
        for i, parts in enumerate(slots):
            members.append(Member(worker, slot_name(worker, i), tuple(parts)))
    committed = committed or {p: 0 for p in backlog}
    end = {p: committed[p] + b + 1 for p, b in backlog.items()}  # +1: the commit marker
    return FleetView(at=at, stable=stable, members=tuple(members), committed=committed,
                     end=end, partitions=len(backlog))


def test_slot_names_round_trip() -> None:
    assert worker_of(slot_name("node1-gpu0", 3)) == "node1-gpu0"
    assert worker_of("plain-client") == "plain-client"


def test_backlog_ignores_the_final_commit_marker() -> None:
    v = view({"a": [[0]]}, {0: 0})
    assert v.backlog(0) == 0 and v.total_backlog() == 0


def test_while_the_group_rebalances_only_the_fair_share_is_opened() -> None:
    v = view({"a": [[0, 1, 2, 3]]}, {p: 10 for p in range(4)}, stable=False)
    assert decide(v, {"a": 1.0}, "a", my_latency_s=1).open == 3
    # ... and only once the fleet stopped joining
    assert decide(v, {"a": 1.0}, "a", my_latency_s=1, settled=False) == Decision(
        why="group rebalancing")
    v = view({"a": [[0], [], [2], [3]], "b": [[1]]}, {p: 100 for p in range(4)}, stable=False)
    assert decide(v, {"a": 1.0, "b": 1.0}, "b", my_latency_s=1) == Decision(
        why="group rebalancing")  # no donations while partitions move


def test_fewer_members_than_partitions_open_slots_up_to_the_fair_share() -> None:
    v = view({"a": [[0, 1, 2, 3]]}, {p: 10 for p in range(4)})
    decision = decide(v, {}, "a", my_latency_s=1)
    assert decision.open == 3 and "towards 4 slots" in decision.why
    # two workers, equal until measured: two slots each
    v = view({"a": [[0, 1], [2]], "b": [[3, 4, 5]]}, {p: 10 for p in range(6)})
    assert decide(v, {}, "a", my_latency_s=1).open == 1
    assert decide(v, {}, "b", my_latency_s=1).open == 2
    # measured: a is three times faster -> 5 of 6 partitions (rounded up)
    assert fair_share(v, {"a": 3.0, "b": 1.0}, "a") == 5
    assert fair_share(v, {"a": 3.0, "b": 1.0}, "b") == 2
    # once there are as many members as partitions, the assignor splits them
    v = view({"a": [[0, 1], [2], [3], []]}, {p: 10 for p in range(4)})
    assert decide(v, {}, "a", my_latency_s=1).open == 0


def test_a_worker_ahead_of_the_fleet_opens_one_standby() -> None:
    # a: 1 partition of 10 at 1/s (eta 10 s); b: 3 partitions of 100 at 1/s (eta 300 s)
    v = view({"a": [[0]], "b": [[1], [2], [3]]}, {0: 10, 1: 100, 2: 100, 3: 100})
    decision = decide(v, {"a": 1.0, "b": 1.0}, "a", my_latency_s=1)
    assert decision.open == 1 and "ahead" in decision.why
    assert decide(v, {"a": 1.0, "b": 1.0}, "b", my_latency_s=1).open == 0


def test_a_worker_behind_hands_its_best_partition_to_a_standby() -> None:
    v = view({"a": [[0], []], "b": [[1], [2], [3]]}, {0: 10, 1: 50, 2: 100, 3: 20})
    decision = decide(v, {"a": 1.0, "b": 1.0}, "b", my_latency_s=1)
    # moving partition 2 (100 left) balances best: b 70 s, a 111 s -> 111 < 170
    assert decision.close == (slot_name("b", 1),) and "hand a partition to a" in decision.why
    # a keeps its standby while it is ahead
    assert decide(v, {"a": 1.0, "b": 1.0}, "a", my_latency_s=1) == Decision()


def test_no_move_when_redoing_the_requests_costs_more_than_it_saves() -> None:
    # the tail: b has 6 records left at 2/s (3 s); a is idle and 3x faster, but
    # redoing b's in-flight requests there costs about one request latency.
    v = view({"a": [[0], []], "b": [[1]]}, {0: 0, 1: 6})
    assert decide(v, {"a": 6.0, "b": 2.0}, "b", my_latency_s=12) == Decision()


def test_standbys_are_closed_when_caught_up_or_done() -> None:
    v = view({"a": [[0], []], "b": [[1]]}, {0: 100, 1: 100})
    assert decide(v, {"a": 1.0, "b": 1.0}, "a", my_latency_s=1).close == (slot_name("a", 1),)
    done = view({"a": [[0], []], "b": [[1]]}, {0: 0, 1: 0})
    assert decide(done, {"a": 1.0, "b": 1.0}, "a", my_latency_s=1).close == (slot_name("a", 1),)


def test_best_move_prefers_the_partition_that_evens_the_two_etas() -> None:
    v = view({"a": [[]], "b": [[0], [1], [2]]}, {0: 10, 1: 40, 2: 80})
    slot, gain = best_move(v, {"a": 1.0, "b": 1.0}, "b", "a", donor_latency_s=0)
    # 80 -> a: b 50 s, a 80 s (max 80) beats 40 -> a: b 90 s (max 90)
    assert slot == slot_name("b", 2)
    assert math.isclose(gain, 130 - 80)


def test_rates_follow_committed_offsets_and_survive_idleness() -> None:
    tracker = RateTracker(halflife_s=0, min_measured_s=10)  # no smoothing: the last interval wins
    owners = {"a": [[0]], "b": [[1]]}
    tracker.observe(view(owners, {0: 100, 1: 100}, at=0.0, committed={0: 0, 1: 0}))
    # the first results (the pipeline filling) only start the count
    tracker.observe(view(owners, {0: 90, 1: 98}, at=10.0, committed={0: 10, 1: 2}))
    assert tracker.rates == {}
    tracker.observe(view(owners, {0: 70, 1: 93}, at=20.0, committed={0: 30, 1: 7}))
    assert tracker.rates == {"a": 2.0, "b": 0.5}
    # a runs out of work: an idle interval does not lower its capacity
    tracker.observe(view(owners, {0: 0, 1: 88}, at=30.0, committed={0: 100, 1: 12}))
    tracker.observe(view(owners, {0: 0, 1: 83}, at=40.0, committed={0: 100, 1: 17}))
    assert tracker.rates["a"] == 7.0  # 70 in the interval it still had work
    # a worker never measured gets the median
    assert tracker.rates_for(["a", "b", "c"])["c"] in (0.5, 7.0)


def test_a_worker_starting_late_is_not_taken_for_a_slow_one() -> None:
    """The cold-start bug: a GPU whose first results came one view later
    measured 0 records/s, looked hours behind, and handed its partitions away."""
    tracker = RateTracker(min_measured_s=6)
    owners = {"early": [[0]], "late": [[1]]}
    committed = {0: 0, 1: 0}
    for t in range(0, 40, 3):
        if t >= 3:
            committed[0] += 6
        if t >= 9:
            committed[1] += 6
        tracker.observe(view(owners, {0: 500 - committed[0], 1: 500 - committed[1]}, at=t,
                             committed=dict(committed)))
        rates = tracker.rates
        assert rates.get("late", 2.0) == 2.0 and rates.get("early", 2.0) == 2.0, (t, rates)
    assert rates == {"early": 2.0, "late": 2.0}


def test_no_rates_before_min_measured_seconds() -> None:
    tracker = RateTracker(halflife_s=1e9, min_measured_s=10)
    owners = {"a": [[0]]}
    for t, c in ((0, 0), (3, 5), (6, 10), (9, 15), (12, 20)):
        tracker.observe(view(owners, {0: 100 - c}, at=t, committed={0: c}))
    assert tracker.rates_for(["a"]) == {}  # 9 s counted (from the first commit at 3 s)
    tracker.observe(view(owners, {0: 75}, at=15, committed={0: 25}))
    assert math.isclose(tracker.rates_for(["a"])["a"], 5 / 3)


# -- a simulated fleet --------------------------------------------------------------

def uniform(members: list[list[int]]) -> None:
    """The broker's uniform assignor, as far as counts go: sticky, and no
    member holds two more than another."""
    while members:
        fullest = max(members, key=len)
        emptiest = min(members, key=len)
        if len(fullest) - len(emptiest) <= 1:
            return
        emptiest.append(fullest.pop())


def simulate(capacities: dict[str, float], partitions: int, per_partition: int,
             *, step_s: float = 1.0, round_s: float = 3.0, latency_s: float = 4.0,
             limit_s: float = 5_000.0, gpus: int | None = None) -> tuple[float, dict[str, int]]:
    """Workers process their owned partitions at their capacity; every round
    each runs `decide` and the outcome is applied the way the broker's
    uniform assignor would (a closed slot's partition goes to a standby).
    `gpus`: the fleet the run was planned for (each worker starts with
    `initial_slots` members). Returns (makespan, records done per worker)."""
    left = {p: float(per_partition) for p in range(partitions)}
    # start: every worker joins with its initial slots; the assignor balances counts
    names = sorted(capacities)
    slots: dict[str, list[list[int]]] = {
        w: [[] for _ in range(initial_slots(partitions, gpus))] for w in names}
    slots[names[0]][0].extend(range(partitions))
    uniform([s for w in names for s in slots[w]])
    done = {w: 0.0 for w in names}
    tracker = RateTracker(halflife_s=10.0)
    committed = {p: 0 for p in left}
    t = 0.0
    next_round = 0.0
    while any(v > 0 for v in left.values()) and t < limit_s:
        for w, cap in capacities.items():
            owned = [p for s in slots[w] for p in s if left[p] > 0]
            if not owned:
                continue
            share = cap * step_s / len(owned)
            for p in owned:
                used = min(share, left[p])
                left[p] -= used
                done[w] += used
                committed[p] = per_partition - math.ceil(left[p])
        t += step_s
        if t < next_round:
            continue
        next_round = t + round_s
        snapshot = view(slots, {p: math.ceil(left[p]) for p in left}, at=t,
                        committed=dict(committed))
        tracker.observe(snapshot)
        rates = tracker.rates_for(names)
        freed: list[int] = []
        for w in names:
            decision = decide(snapshot, rates, w, my_latency_s=latency_s)
            for _ in range(decision.open):
                slots[w].append([])
            gone = {int(name.rsplit("#", 1)[1]) for name in decision.close}
            freed.extend(p for i in gone if i < len(slots[w]) for p in slots[w][i])
            slots[w] = [s for i, s in enumerate(slots[w]) if i not in gone]
        members = [s for w in names for s in slots[w]]
        for p in freed:  # the assignor: to the member with the fewest partitions
            min(members, key=len).append(p)
        uniform(members)
    return t, done


def test_a_mixed_fleet_finishes_near_a_shared_queue() -> None:
    capacities = {"fast1": 8.0, "fast2": 8.0, "slow": 2.7}
    makespan, done = simulate(capacities, partitions=12, per_partition=100)
    ideal = 1200 / sum(capacities.values())
    assert makespan <= 1.15 * ideal + 10, (makespan, ideal, done)
    assert done["slow"] < done["fast1"] / 2  # the slow GPU did a small share


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(min_value=1.0, max_value=10.0), min_size=2, max_size=4),
       st.integers(min_value=2, max_value=6))
def test_any_fleet_converges(capacities, per_gpu) -> None:
    """Runs long against the 3 s rounds (a real run is hours of them): the
    makespan stays within the planner's slack of the best one whole
    partitions allow (a shared queue's is lower when a partition is more
    than a slow GPU's share: 6 partitions on GPUs of 1, 1 and 7 records/s)."""
    names = {f"w{i}": c for i, c in enumerate(capacities)}
    partitions = per_gpu * len(names)
    makespan, done = simulate(names, partitions, per_partition=600)
    assert math.isclose(sum(done.values()), partitions * 600)  # every record done once
    best = whole_partition_makespan(capacities, partitions, 600)
    assert makespan <= 1.2 * best + 10, (makespan, best, done)


def whole_partition_makespan(capacities: list[float], partitions: int, size: int) -> float:
    """The least makespan with each partition on one GPU from the start
    (equal partitions: each to the GPU that would finish it first)."""
    counts = [0] * len(capacities)
    for _ in range(partitions):
        i = min(range(len(capacities)), key=lambda i: (counts[i] + 1) * size / capacities[i])
        counts[i] += 1
    return max(c * size / cap for c, cap in zip(counts, capacities, strict=True))


def test_whole_partition_makespan() -> None:
    assert whole_partition_makespan([1.0, 1.0, 7.0], 6, 600) == 6 * 600 / 7
    assert whole_partition_makespan([2.0, 2.0], 4, 10) == 10.0


def test_an_equal_fleet_started_with_its_planned_slots_moves_nothing() -> None:
    capacities = {"g0": 8.0, "g1": 8.0, "g2": 8.0}
    makespan, done = simulate(capacities, partitions=12, per_partition=100, gpus=3)
    assert makespan == 1200 / 24
    assert done == {"g0": 400, "g1": 400, "g2": 400}


def test_initial_slots_are_the_planned_share() -> None:
    assert initial_slots(12, 3) == 4
    assert initial_slots(28, 7) == 4
    assert initial_slots(10, 3) == 4  # rounded up: a member too many is a standby
    assert initial_slots(12, None) == 1  # fleet unknown: split later
    assert initial_slots(4096, 1, max_slots=256) == 256


def test_a_slow_worker_does_not_compete_for_a_partition_it_would_not_speed_up() -> None:
    # a and b are equally slow, c is fast; a has less left than b, but taking
    # one of b's partitions would not finish it sooner: only c asks.
    v = view({"a": [[0]], "b": [[1], [2]], "c": [[3]]}, {0: 50, 1: 100, 2: 100, 3: 10})
    rates = {"a": 1.0, "b": 1.0, "c": 7.0}
    assert decide(v, rates, "a", my_latency_s=1) == Decision()
    assert decide(v, rates, "c", my_latency_s=1).open == 1


def test_one_donor_serves_every_waiting_standby_in_one_round() -> None:
    v = view({"f1": [[0], []], "f2": [[1], []], "slow": [[2], [3], [4], [5]]},
             {0: 5, 1: 5, 2: 100, 3: 100, 4: 100, 5: 100})
    rates = {"f1": 6.0, "f2": 6.0, "slow": 1.0}
    decision = decide(v, rates, "slow", my_latency_s=1)
    assert len(decision.close) == 2 and len(set(decision.close)) == 2
    assert "f1" in decision.why and "f2" in decision.why
