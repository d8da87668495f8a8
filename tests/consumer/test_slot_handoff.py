"""A partition that moves between two slots of one worker before the old
slot learns it lost it (KIP-848 assigns it to the new member once the old
one's session expired; the old one hears of it later, under load seconds
later). The old slot's late callbacks and late messages must not touch the
state the new slot holds. Before, the state was keyed by partition alone:
the old slot's `lost` dropped the new slot's state, the new slot's records
were then thrown away as "a partition we no longer own" while its position
moved on, and the run stopped short with those prompts never generated
(seen beside a CPU hog in tests/consumer/test_stranding.py: 246 of 6,000)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
from confluent_kafka import TopicPartition

from consumer.membership import Slot
from consumer.worker import Worker, WorkerConfig
from schemas import GenerationSettings, RunSpec
from tests.consumer.pipeline import make_prompts
from tokenmill.kafka import topics
from tokenmill.settings import Settings

RUN = "tslothandoff1"
COMMITTED = 100


@dataclass
class FakeMessage:
    """What the worker reads off a confluent-kafka Message."""

    _topic: str
    _partition: int
    _offset: int
    _value: bytes

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return b"k"


class FakeMembers:
    """Committed offsets only: the callbacks ask nothing else of the group."""

    def committed(self, slot: Slot, partitions: list[TopicPartition]) -> dict[Any, int]:
        return {(tp.topic, tp.partition): COMMITTED for tp in partitions}


def _worker() -> Worker:
    spec = RunSpec(run_id=RUN, partitions=4, generation=GenerationSettings(model="sim"))
    worker = Worker(Settings(bootstrap_servers="127.0.0.1:1"), spec,
                    WorkerConfig(sglang_url="http://127.0.0.1:1", instance="w"))
    worker._members = FakeMembers()  # type: ignore[assignment]
    worker._txns = object()  # type: ignore[assignment]  # nothing is ready to commit
    return worker


def _message(offset: int) -> FakeMessage:
    prompt = make_prompts(RUN, 1)[0]
    return FakeMessage(topics.prompts_topic(RUN), 3, offset, msgspec.json.encode(prompt))


def test_an_old_slots_late_loss_and_messages_leave_the_new_slots_partition_alone() -> None:
    worker = _worker()
    old, new = Slot("w#0", consumer=None), Slot("w#1", consumer=None)  # type: ignore[arg-type]
    tp = TopicPartition(topics.prompts_topic(RUN), 3)
    key = (tp.topic, 3)

    worker._on_assign(old, [tp])
    worker.intake.accept(_message(COMMITTED), old.name)
    worker.intake.accept(_message(COMMITTED + 1), old.name)
    assert worker.states[key].slot == old.name and len(worker.states[key].queue) == 2

    # The group moved the partition to the new slot; the old one has not heard yet.
    worker._on_assign(new, [tp])
    state = worker.states[key]
    assert state.slot == new.name and not state.queue and state.last_fetched is None
    # The old slot's fetches still arrive: they must not enter the new state
    # (the new slot reads from the committed offset itself).
    worker.intake.accept(_message(COMMITTED + 2), old.name)
    assert state.last_fetched is None and not state.queue
    # The old slot learns of its loss, or is revoked: the new state stays.
    worker._on_lost(old, [tp])
    worker._on_revoke(old, [tp])
    assert worker.states.get(key) is state
    # and the new slot's records from the committed offset are taken in order
    for offset in (COMMITTED, COMMITTED + 1, COMMITTED + 2):
        worker.intake.accept(_message(offset), new.name)
    assert [o for o, _ in state.queue] == [COMMITTED, COMMITTED + 1, COMMITTED + 2]


def test_a_slots_own_loss_still_drops_its_state() -> None:
    worker = _worker()
    slot = Slot("w#0", consumer=None)  # type: ignore[arg-type]
    tp = TopicPartition(topics.prompts_topic(RUN), 3)
    worker._on_assign(slot, [tp])
    worker._on_lost(slot, [tp])
    assert (tp.topic, 3) not in worker.states
