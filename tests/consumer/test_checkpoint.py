"""What a worker's transaction holds (consumer/checkpoint.py), without a
broker: the ready prefix of each partition, the safe next offsets grouped by
slot, the counters after them, and what a commit changes only once it
succeeded."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from consumer.checkpoint import Checkpoint, Vitals, commit, ready_batches
from consumer.partitions import Output, PartitionState
from consumer.recent_rate import RecentRate
from schemas import Completion, Message, PromptRecord
from schemas.completion import Step, Usage
from schemas.progress import ConsumerProgress, ServerSnapshot
from schemas.turn import TurnRecord
from tokenmill.kafka.transactions import GroupOffsets

RUN = "tcheckpoint"
PROMPTS = f"tokenmill.{RUN}.prompts"
TURNS = f"tokenmill.{RUN}.turns"


def prompt(offset: int) -> PromptRecord:
    return PromptRecord(id=f"p{offset}", run=RUN, messages=(Message(role="user", content="hi"),),
                        source="t.jsonl", format="plain", category="plain")


def completion(offset: int, tokens: int = 10) -> Completion:
    return Completion(id=f"p{offset}", run=RUN, settings_hash="h", prompt=prompt(offset),
                      finish_reason="stop", content="ok",
                      usage=Usage(prompt_tokens=5, completion_tokens=tokens))


def state(partition: int, slot: str, *, start: int = 0, fetched: Sequence[int] = (),
          finished: Sequence[int] = (), topic: str = PROMPTS) -> PartitionState:
    s = PartitionState(partition, slot, start_offset=start, topic=topic)
    for offset in fetched:
        s.watermark.track(offset)
        s.last_fetched = offset
    for offset in finished:
        s.watermark.finish(offset, completion(offset))
    return s


def checkpoint(states: Sequence[PartitionState], *, max_records: int = 100,
               progress: ConsumerProgress | None = None, final: bool = False,
               now: float = 1000.0, vitals: Vitals = Vitals()) -> Checkpoint:
    return Checkpoint.of(ready_batches(states, max_records),
                         progress=progress or ConsumerProgress(run=RUN, instance="w"),
                         recent=RecentRate(), vitals=vitals, heartbeat_s=10.0, final=final,
                         now=now)


# -- what it holds -------------------------------------------------------------


def test_only_the_finished_prefix_of_each_partition_is_in_it() -> None:
    gap = state(0, "w#0", fetched=[0, 1, 3], finished=[0, 3])  # 1 is still running
    done = state(1, "w#0", fetched=[7, 9], finished=[9, 7])
    idle = state(2, "w#0", fetched=[4])
    batches = ready_batches([gap, done, idle], max_records=100)
    assert [(b.state.partition, [r.id for r in b.records], b.next_offset) for b in batches] == [
        (0, ["p0"], 1), (1, ["p7", "p9"], 10)]


def test_max_records_caps_each_partition() -> None:
    s = state(0, "w#0", fetched=range(10), finished=range(10))
    (batch,) = ready_batches([s], max_records=4)
    assert [r.id for r in batch.records] == ["p0", "p1", "p2", "p3"] and batch.next_offset == 4


def test_offsets_are_grouped_by_the_slot_holding_each_partition() -> None:
    a = state(0, "w#0", fetched=[5], finished=[5])
    b = state(1, "w#1", fetched=[8], finished=[8])
    c = state(2, "w#1", fetched=[2], finished=[2], topic=TURNS)
    assert checkpoint([a, b, c]).offsets() == {
        "w#0": {(PROMPTS, 0): 6}, "w#1": {(PROMPTS, 1): 9, (TURNS, 2): 3}}


def test_the_progress_record_counts_the_records_and_says_how_the_worker_is() -> None:
    a = state(0, "w#0", fetched=[0, 1], finished=[0, 1])
    a.retries = 3
    waiting = state(1, "w#0", fetched=[0])
    waiting.retries = 5  # its results are not in this commit: neither are its retries
    server = ServerSnapshot(running=4, queued=1)
    vitals = Vitals(concurrency_limit=32, in_flight=7, breaker="", server=server, partitions=2)
    before = ConsumerProgress(run=RUN, instance="w", completions=10, completion_tokens=100,
                              started_at=1.0)
    cp = checkpoint([a, waiting], progress=before, vitals=vitals, now=2000.0)
    p = cp.progress
    assert (p.completions, p.completion_tokens, p.retries) == (12, 120, 3)
    assert (p.concurrency_limit, p.in_flight, p.server, p.partitions) == (32, 7, server, 2)
    assert (p.last_work_at, p.updated_at, p.stopped_at, p.heartbeat_s) == (2000, 2000, 0, 10)
    assert cp.totals == (12, 120) and cp.at == 2000.0
    assert checkpoint([], progress=before, final=True, now=3000.0).progress.stopped_at == 3000


def test_a_heartbeat_commits_the_counters_alone() -> None:
    before = ConsumerProgress(run=RUN, instance="w", completions=4, last_work_at=50.0)
    cp = checkpoint([state(0, "w#0", fetched=[0])], progress=before, now=99.0)
    assert cp.batches == () and cp.offsets() == {}
    assert (cp.progress.completions, cp.progress.last_work_at) == (4, 50.0)


def test_settling_takes_the_results_and_moves_the_committed_offset() -> None:
    s = state(0, "w#0", start=0, fetched=[0, 1, 2], finished=[0, 1])
    s.retries = 2
    cp = checkpoint([s])
    assert s.committed is None and s.watermark.ready_count() == 2  # nothing moves before
    cp.settle()
    assert (s.committed, s.retries, s.watermark.ready_count(), s.watermark.tracked) == (2, 0, 0, 1)
    assert checkpoint([s]).batches == ()


def test_an_unsettled_checkpoint_leaves_its_results_for_the_next() -> None:
    s = state(0, "w#0", fetched=[0, 1], finished=[0])
    first = checkpoint([s])  # say its transaction aborted: never settled
    s.watermark.finish(1, completion(1))
    again = checkpoint([s])
    assert [r.id for r in again.records] == ["p0", "p1"] and again.offsets() == {"w#0": {
        (PROMPTS, 0): 2}}
    assert first.records == again.records[:1]


# -- the transaction -------------------------------------------------------------


class RecordingTransactions:
    """Transactions' interface, recording what one transaction would hold."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes, bytes | None, int | None]] = []
        self.offsets: list[GroupOffsets] = []

    @contextmanager
    def transaction(self, offsets: Callable[[], Sequence[GroupOffsets]]) -> Iterator[Any]:
        yield self
        self.offsets = list(offsets())  # after the records, as the real one

    def produce(self, topic: str, value: bytes, key: bytes | None = None,
                partition: int | None = None) -> None:
        self.produced.append((topic, value, key, partition))


def test_commit_routes_each_record_and_sends_each_slots_offsets() -> None:
    turn = TurnRecord(id="p1", run=RUN, settings_hash="h", prompt=prompt(1),
                      steps=(Step(turn=0, finish_reason="stop", content="a"),), next_turn=1)
    s = PartitionState(3, "w#1", start_offset=0, topic=PROMPTS)
    for offset, record in ((0, completion(0)), (1, turn)):
        s.watermark.track(offset)
        s.watermark.finish(offset, record)
    cp = checkpoint([s])
    txns = RecordingTransactions()
    asked: list[Mapping[str, Mapping[tuple[str, int], int]]] = []

    def group_offsets(by_slot: Mapping[str, Mapping[tuple[str, int], int]]
                      ) -> list[GroupOffsets]:
        asked.append(by_slot)
        return []

    def topic_of(record: Output) -> str:
        return TURNS if isinstance(record, TurnRecord) else f"tokenmill.{RUN}.completions"

    commit(cp, txns, group_offsets=group_offsets, topic_of=topic_of,  # type: ignore[arg-type]
           progress_topic="progress", progress_key="tcheckpoint/consumer/w")
    assert [(t, k, p) for t, _, k, p in txns.produced] == [
        (f"tokenmill.{RUN}.completions", b"p0", 3), (TURNS, b"p1", 3),
        ("progress", b"tcheckpoint/consumer/w", None)]
    assert msgspec.json.decode(txns.produced[-1][1])["completions"] == 1
    assert asked == [{"w#1": {(PROMPTS, 3): 2}}]
    assert s.watermark.ready_count() == 2  # committing settles nothing by itself


# -- invariants over any sequence of fetches, finishes and commits -----------------


Action = tuple[str, int]


@st.composite
def runs(draw: Any) -> tuple[int, list[Action]]:
    start = draw(st.integers(0, 50))
    actions = draw(st.lists(st.one_of(
        st.tuples(st.just("fetch"), st.integers(1, 3)),  # gap > 1: a transaction marker
        st.tuples(st.just("finish"), st.integers(0, 1000)),  # which unfinished one
        st.tuples(st.just("commit"), st.integers(0, 1)),  # 1: committed, 0: aborted
    ), max_size=80))
    return start, actions


@settings(max_examples=300)
@given(runs(), st.integers(1, 5))
def test_offsets_never_go_back_and_only_committed_results_are_taken(
        run: tuple[int, list[Action]], max_records: int) -> None:
    start, actions = run
    s = PartitionState(0, "w#0", start_offset=start, topic=PROMPTS)
    fetched: list[int] = []
    unfinished: list[int] = []
    committed_ids: list[str] = []
    next_offset = start
    for kind, n in actions:
        if kind == "fetch":
            s.watermark.track(next_offset)
            fetched.append(next_offset)
            unfinished.append(next_offset)
            next_offset += n
        elif kind == "finish" and unfinished:
            offset = unfinished.pop(n % len(unfinished))
            s.watermark.finish(offset, completion(offset))
        elif kind == "commit":
            before = (s.committed_offset(), s.watermark.tracked, s.watermark.ready_count())
            cp = checkpoint([s], max_records=max_records)
            if not n:  # aborted: nothing is taken, nothing moves
                assert (s.committed_offset(), s.watermark.tracked,
                        s.watermark.ready_count()) == before
                continue
            cp.settle()
            committed_ids += [r.id for r in cp.records]
            if cp.batches:
                (batch,) = cp.batches
                assert before[0] is not None and batch.next_offset > before[0]
                assert s.committed == batch.next_offset
                assert batch.next_offset - 1 in fetched
                assert s.watermark.tracked == before[1] - len(cp.records)
            else:
                assert s.committed_offset() == before[0]
    # what was taken is exactly the fetched prefix, in order, each committed once
    taken = len(fetched) - s.watermark.tracked
    assert committed_ids == [f"p{offset}" for offset in fetched[:taken]]
    if taken:
        assert s.committed == fetched[taken - 1] + 1
