"""Partition ownership by slot (consumer/ownership.py), without a broker: a
slot's callbacks reach only the states it holds, whatever order the group's
news of several slots arrives in; parked partitions resume or are dropped."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.metrics import ConsumerMetrics
from consumer.ownership import Ownership

TOPIC = "tokenmill.town.prompts"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Request:
    """A request in flight, as far as ownership cares: it can be cancelled."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def ownership(clock: Clock | None = None) -> Ownership:
    return Ownership(prompts_topic=TOPIC, park_s=3.0, metrics=ConsumerMetrics(),
                     clock=clock or Clock())


def tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(TOPIC, p) for p in partitions]


def committed(offset: int | None, *partitions: int) -> dict[tuple[str, int], int | None]:
    return {(TOPIC, p): offset for p in partitions}


def in_flight(own: Ownership, slot: str, partition: int, offset: int) -> Request:
    state = own.state(slot, (TOPIC, partition))
    assert state is not None
    state.watermark.track(offset)
    state.last_fetched = offset
    request = Request()
    state.tasks[offset] = request  # type: ignore[assignment]
    return request


def test_an_old_slots_late_news_leaves_the_new_slots_state_alone() -> None:
    own = ownership()
    own.assign("w#0", tps(3), committed(100, 3))
    old_request = in_flight(own, "w#0", 3, 100)
    own.assign("w#1", tps(3), committed(100, 3))  # the group moved it first
    new = own.state("w#1", (TOPIC, 3))
    assert new is not None and old_request.cancelled and own.wasted == {"lost": 1}
    assert own.state("w#0", (TOPIC, 3)) is None and own.of_slot("w#0", tps(3)) == []
    own.lose("w#0", tps(3))
    own.revoke("w#0", tps(3), park=True)
    assert own.state("w#1", (TOPIC, 3)) is new and own.by_key() == {(TOPIC, 3): new}


def test_a_parked_partition_resumes_under_the_next_slot_where_it_stopped() -> None:
    own = ownership()
    own.assign("w#0", tps(1), committed(10, 1))
    request = in_flight(own, "w#0", 1, 10)
    own.revoke("w#0", tps(1), park=True)
    assert own.states() == [] and own.in_flight == 1  # parked: still running
    partitions = tps(1)
    own.assign("w#1", partitions, committed(10, 1))  # nobody committed meanwhile
    state = own.state("w#1", (TOPIC, 1))
    assert state is not None and state.slot == "w#1" and not state.parked
    assert partitions[0].offset == 11 and not request.cancelled and own.wasted == {}


def test_a_parked_partition_someone_committed_for_is_dropped() -> None:
    own = ownership()
    own.assign("w#0", tps(1), committed(10, 1))
    request = in_flight(own, "w#0", 1, 10)
    own.revoke("w#0", tps(1), park=True)
    own.assign("w#1", tps(1), committed(11, 1))
    assert request.cancelled and own.wasted == {"moved": 1}
    state = own.state("w#1", (TOPIC, 1))
    assert state is not None and state.start_offset == 11 and not state.tasks


def test_parked_partitions_expire() -> None:
    clock = Clock()
    own = ownership(clock)
    own.assign("w#0", tps(1, 2), committed(0, 1, 2))
    first, second = in_flight(own, "w#0", 1, 0), in_flight(own, "w#0", 2, 0)
    own.revoke("w#0", tps(1), park=True)
    own.revoke("w#0", tps(2), park=False)  # stopping: dropped at once
    assert second.cancelled and own.wasted == {"revoked": 1}
    clock.now += 2.9
    own.expire_parked()
    assert not first.cancelled
    clock.now += 0.2
    own.expire_parked()
    assert first.cancelled and own.wasted == {"revoked": 1, "moved": 1} and own.in_flight == 0


def test_turns_partitions_are_labelled_apart() -> None:
    own = ownership()
    assert own.labels([("tokenmill.town.turns", 2), (TOPIC, 2)]) == [2, "turns-2"]


@st.composite
def news(draw: Any) -> list[tuple[str, str, int]]:
    """The group's callbacks to three slots about three partitions, in any order."""
    return draw(st.lists(st.tuples(st.sampled_from(["assign", "revoke", "lose"]),
                                   st.sampled_from(["w#0", "w#1", "w#2"]),
                                   st.integers(0, 2)), max_size=40))


@settings(max_examples=300)
@given(news())
def test_a_slots_callback_only_ever_touches_the_states_it_holds(events: list[Any]) -> None:
    own = ownership()
    for kind, slot, partition in events:
        before = {(s.slot, s.key): s for s in own.states()}
        if kind == "assign":
            own.assign(slot, tps(partition), committed(0, partition))
        elif kind == "revoke":
            own.revoke(slot, tps(partition), park=False)
        else:
            own.lose(slot, tps(partition))
        after = {(s.slot, s.key): s for s in own.states()}
        keys = [s.key for s in own.states()]
        assert len(keys) == len(set(keys))  # one holder per partition
        for (holder, key), state in before.items():
            touched = holder == slot or (kind == "assign" and key == (TOPIC, partition))
            if not touched:
                assert after.get((holder, key)) is state
        if kind == "assign":
            assert own.state(slot, (TOPIC, partition)) is not None
        else:
            assert own.state(slot, (TOPIC, partition)) is None
