"""The flush round without Kafka or S3 (sink/round.py): uploads are futures
the test completes, the committer a fake that can abort. A state machine
drives assignments, records, rounds, upload outcomes, aborts, revokes and
losses in any order, and checks what a round may commit."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from schemas import SinkProgress
from sink.batcher import Batch, BatchLimits, DeadLetterOut
from sink.errors import ObjectConflict, S3Failed
from sink.liveness import Liveness
from sink.metrics import SinkMetrics
from sink.ownership import Ownership
from sink.probes import Probes
from sink.round import Contents, Rounds, Written
from sink.s3_attempts import S3Errors
from sink.s3_writer import Uploaded
from tokenmill.kafka.transactions import TransactionAborted

PARTITIONS = range(3)


def record_at(position: int) -> int:
    """The first record at or after `position`: offsets 2, 5, 8... are
    transaction markers, so offsets are never counted."""
    return position + 1 if position % 3 == 2 else position


def letter(reason: str = "trivial") -> DeadLetterOut:
    return DeadLetterOut(key=b"k", value=b"v", headers=[], reason=reason)


class FakeS3:
    """Uploads as futures the test completes; checks that a partition never
    has two uploads in flight and that only an owned batcher's oldest
    sealed batch is uploaded."""

    def __init__(self) -> None:
        self.ownership: Ownership | None = None
        self.unsettled: dict[int, Future[Uploaded | None]] = {}
        self.futures: dict[int, Future[Uploaded | None]] = {}  # by id(batch)
        self.lines: dict[int, int] = {}  # of the batch uploading, per partition

    def upload(self, batch: Batch) -> Future[Uploaded | None]:
        assert batch.partition not in self.unsettled, "two uploads in flight"
        assert self.ownership is not None
        batcher = self.ownership.batchers.get(batch.partition)
        assert batcher is not None and batcher.ready() is batch, "not an owned batcher's oldest"
        future: Future[Uploaded | None] = Future()
        self.lines[batch.partition] = batch.line_count
        self.unsettled[batch.partition] = future
        self.futures[id(batch)] = future
        return future

    def lookup(self, partition: int, offset: int) -> Future[tuple[()]]:
        raise AssertionError("no probes in these tests")

    def returned(self, batch: Batch) -> bool:
        future = self.futures.get(id(batch))
        return future is not None and future.done() and future.exception() is None


class FakeCommitter:
    """Records each committed round; aborts when told to."""

    def __init__(self, s3: FakeS3) -> None:
        self.s3 = s3
        self.ownership: Ownership | None = None
        self.abort_next = False
        # (first offset, next offset) per partition, of each committed round
        self.offsets: list[dict[int, tuple[int, int]]] = []
        self.records: list[SinkProgress] = []
        self.lines = self.letters = self.objects = 0

    def commit(self, batches: list[Batch], progress: SinkProgress) -> None:
        assert self.ownership is not None
        for batch in batches:
            assert self.s3.returned(batch), "an offset committed before its upload returned"
            assert batch.partition in self.ownership.batchers, "a commit for a partition gone"
        if self.abort_next:
            self.abort_next = False
            raise TransactionAborted("told to")
        self.offsets.append({b.partition: (b.first_offset, b.next_offset) for b in batches})
        self.records.append(progress)
        self.lines += sum(b.line_count for b in batches)
        self.letters += sum(len(b.dead_letters) for b in batches)
        self.objects += sum(1 for b in batches if b.line_count)


class Harness:
    def __init__(self, max_records: int = 3) -> None:
        self.s3 = FakeS3()
        self.committer = FakeCommitter(self.s3)
        self.metrics = SinkMetrics()
        self.seeks: list[tuple[int, int]] = []
        self.probes = Probes(lookup=self.s3.lookup, seek=self.seek)
        self.ownership = Ownership(
            limits=BatchLimits(max_records=max_records, max_bytes=10**9, max_age_s=1e9),
            clock=lambda: 0.0, metrics=self.metrics, probes=self.probes, seek=self.seek)
        self.s3.ownership = self.committer.ownership = self.ownership
        self.liveness = Liveness(progress=SinkProgress(run="r", instance="i"),
                                 committer=self.committer, ownership=self.ownership,
                                 s3_errors=S3Errors(), heartbeat_s=10.0, clock=lambda: 0.0,
                                 last_commit=0.0)
        self.rounds = Rounds(ownership=self.ownership, upload=self.s3.upload,
                             committer=self.committer, liveness=self.liveness,
                             metrics=self.metrics)
        self.position: dict[int, int] = {}
        self.conflicted: set[int] = set()  # partitions whose upload lost a conditional write

    def seek(self, partition: int, offset: int) -> None:
        self.seeks.append((partition, offset))
        self.position[partition] = offset

    def feed(self, partition: int, count: int, *, dead: bool = False) -> None:
        """`count` records of the partition, read from its position."""
        batcher = self.ownership.batchers[partition]
        for _ in range(count):
            offset = record_at(self.position[partition])
            self.position[partition] = offset + 1
            if batcher.accepts(offset):
                if dead:
                    batcher.add(offset, dead_letter=letter())
                else:
                    batcher.add(offset, line=b'{"id": "x"}\n')

    def complete(self, partition: int, how: str) -> None:
        future = self.s3.unsettled[partition]
        if how == "conflict":
            self.conflicted.add(partition)
        if how == "ok":  # a batch of DLQ records only has no object
            future.set_result(Uploaded(key=f"k{partition}", etag="e", size=10, parts=1)
                              if self.s3.lines[partition] else None)
        elif how == "conflict":
            future.set_exception(ObjectConflict(f"k{partition}"))
        else:
            future.set_exception(S3Failed("gave up"))

    def settle_all(self, how: str = "ok") -> None:
        for partition, future in self.s3.unsettled.items():
            if not future.done():
                self.complete(partition, how)

    def in_round(self) -> set[int]:
        current = self.rounds.in_flight
        return set(current.partitions) if current is not None else set()

    def after(self) -> None:
        if self.rounds.in_flight is None:
            self.s3.unsettled.clear()
            self.conflicted.clear()


class RoundMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.committed: dict[int, int] = {}  # partition -> next offset committed

    def _note_commits(self, before: int) -> None:
        for offsets in self.h.committer.offsets[before:]:
            for partition, (first, after) in offsets.items():
                # Contiguous: the batch starts at the first record not committed.
                assert first == record_at(self.committed.get(partition, 0))
                assert after > first
                self.committed[partition] = after

    def _owned(self) -> list[int]:
        return sorted(self.h.ownership.batchers)

    @rule(partition=st.sampled_from(PARTITIONS))
    def assign(self, partition: int) -> None:
        if partition in self.h.ownership.batchers:
            return
        self.h.ownership.assign([partition])
        self.h.position[partition] = self.committed.get(partition, 0)  # the group's offset

    @rule(data=st.data(), count=st.integers(1, 7), dead=st.booleans())
    def feed(self, data: st.DataObject, count: int, dead: bool) -> None:
        owned = self._owned()
        if owned:
            self.h.feed(data.draw(st.sampled_from(owned)), count, dead=dead)

    @rule()
    def drain(self) -> None:
        self.h.ownership.drain()

    @precondition(lambda self: self.h.rounds.in_flight is None
                  or not self.h.rounds.in_flight.done())
    @rule()
    def loop_turn(self) -> None:
        """The loop's call: starts a round unless one is in flight."""
        self.h.rounds.advance(start=True)
        self.h.after()

    @rule(data=st.data(), how=st.sampled_from(["ok", "ok", "conflict"]))
    def upload_returns(self, data: st.DataObject, how: str) -> None:
        pending = [p for p, f in self.h.s3.unsettled.items() if not f.done()]
        if pending:
            self.h.complete(data.draw(st.sampled_from(pending)), how)

    @precondition(lambda self: self.h.rounds.in_flight is not None
                  and self.h.rounds.in_flight.done())
    @rule(abort=st.booleans())
    def finish(self, abort: bool) -> None:
        self.h.committer.abort_next = abort
        before, seeks = len(self.h.committer.offsets), len(self.h.seeks)
        in_round, conflicted = self.h.in_round(), set(self.h.conflicted)
        self.h.rounds.advance(start=False)
        self.h.committer.abort_next = False
        # Rewound: the conflicted batches, and every batch of an aborted round.
        expected = in_round if abort else conflicted
        assert {p for p, _ in self.h.seeks[seeks:]} == expected
        self._note_commits(before)
        self.h.after()

    @rule(data=st.data(), lost=st.booleans(), how=st.sampled_from(["ok", "conflict"]))
    def leave(self, data: st.DataObject, lost: bool, how: str) -> None:
        owned = self._owned()
        if not owned:
            return
        partition = data.draw(st.sampled_from(owned))
        self.h.settle_all(how)  # uploads cannot be recalled: they return first
        before, seeks = len(self.h.committer.offsets), len(self.h.seeks)
        in_round, conflicted = self.h.in_round(), set(self.h.conflicted)
        self.h.rounds.leave([partition], lost=lost)
        # Rewound: the conflicted batches (all, when lost), never the leaving one.
        expected = (in_round if lost else conflicted) - {partition}
        assert {p for p, _ in self.h.seeks[seeks:]} == expected
        self.h.after()
        assert partition not in self.h.ownership.batchers, "a leaving batcher kept"
        assert partition not in self.h.probes
        assert self.h.rounds.in_flight is None
        if lost:
            assert len(self.h.committer.offsets) == before, "a lost partition committed"
        assert all(p != partition for p, _ in self.h.seeks[seeks:]), "a leaving one rewound"
        self._note_commits(before)

    @invariant()
    def rewinds_go_back_to_the_committed_offset(self) -> None:
        for partition, offset in self.h.seeks:
            assert offset == record_at(self.committed.get(partition, 0))
        self.h.seeks.clear()

    @invariant()
    def one_upload_at_most_per_partition(self) -> None:
        current = self.h.rounds.in_flight
        if current is not None:
            assert len(current.partitions) == len(set(current.partitions))

    @invariant()
    def counters_follow_the_commits(self) -> None:
        progress, committer = self.h.liveness.progress, self.h.committer
        if committer.records:
            assert progress == committer.records[-1]
        assert (progress.s3_records, progress.dlq_records, progress.s3_objects) == (
            committer.lines, committer.letters, committer.objects)


TestRoundMachine = RoundMachine.TestCase
TestRoundMachine.settings = hsettings(max_examples=300, stateful_step_count=40, deadline=None)


# -- the rules one by one ------------------------------------------------------------


def _round_of_two(h: Harness) -> None:
    """Partitions 0 and 1 each with one sealed batch (offsets 0, 1, 3), uploading."""
    h.ownership.assign([0, 1])
    h.position.update({0: 0, 1: 0})
    h.feed(0, 3)
    h.feed(1, 2)
    h.feed(1, 1, dead=True)
    assert h.rounds.start()


def test_a_revoke_commits_the_round_in_flight_then_drops_the_partition() -> None:
    h = Harness()
    _round_of_two(h)
    h.settle_all()
    h.rounds.leave([0], lost=False)
    assert h.committer.offsets == [{0: (0, 4), 1: (0, 4)}]
    assert list(h.ownership.batchers) == [1] and h.ownership.batchers[1].idle
    assert h.seeks == [] and h.rounds.in_flight is None
    assert (h.liveness.progress.s3_objects, h.liveness.progress.s3_records,
            h.liveness.progress.dlq_by_reason) == (2, 5, {"trivial": 1})


def test_a_loss_commits_nothing_and_rewinds_only_the_partitions_that_stay() -> None:
    h = Harness()
    _round_of_two(h)
    h.settle_all()
    h.rounds.leave([0], lost=True)
    assert h.committer.offsets == [] and h.liveness.progress.s3_objects == 0
    assert list(h.ownership.batchers) == [1]
    assert h.seeks == [(1, 0)]  # partition 1 is read again; 0 is gone


def test_an_aborted_commit_rewinds_every_batch_of_the_round() -> None:
    h = Harness()
    _round_of_two(h)
    h.settle_all()
    h.committer.abort_next = True
    h.rounds.advance(start=False)
    assert h.committer.offsets == [] and sorted(h.seeks) == [(0, 0), (1, 0)]
    assert h.metrics.registry.get_sample_value("tokenmill_sink_aborted_commits_total") == 1
    assert all(b.idle and b.needs_probe for b in h.ownership.batchers.values())


def test_a_lost_conditional_write_replays_that_batch_and_commits_the_others() -> None:
    h = Harness()
    _round_of_two(h)
    h.complete(0, "conflict")
    h.complete(1, "ok")
    h.rounds.advance(start=False)
    assert h.committer.offsets == [{1: (0, 4)}]
    assert h.seeks == [(0, 0)]
    assert h.metrics.registry.get_sample_value("tokenmill_sink_conflicts_total") == 1


def test_a_failed_upload_raises_once_every_upload_returned_and_commits_nothing() -> None:
    h = Harness()
    _round_of_two(h)
    h.complete(0, "failed")
    assert not h.rounds.in_flight.done()  # type: ignore[union-attr]
    h.complete(1, "ok")
    with pytest.raises(S3Failed):
        h.rounds.advance(start=False)
    assert h.committer.offsets == [] and h.rounds.in_flight is None


def test_no_round_starts_while_one_is_in_flight() -> None:
    h = Harness()
    _round_of_two(h)
    with pytest.raises(RuntimeError):
        h.rounds.start()


def test_contents_counts_the_batches_and_commits_the_offset_after_each_last_record() -> None:
    h = Harness()
    _round_of_two(h)
    h.settle_all()
    current = h.rounds.in_flight
    assert current is not None
    settled = current.settle()
    contents = Contents.of(settled.written)
    assert contents.next_offsets == {0: 4, 1: 4}  # offset 2 is a marker: never counted
    assert (contents.s3_records, contents.s3_bytes, contents.dlq_by_reason) == (
        5, 20, {"trivial": 1})
    before = SinkProgress(run="r", instance="i", s3_records=7, dlq_by_reason={"trivial": 2})
    after = contents.progress(before, now=5.0, liveness={"partitions": 2})
    assert (after.s3_records, after.s3_objects, after.dlq_records, after.dlq_by_reason) == (
        12, 2, 1, {"trivial": 3})
    assert (after.last_object, after.last_upload_at, after.partitions) == ("k1", 5.0, 2)
    assert Contents.of([Written(w.batcher, w.batch, None) for w in settled.written]).objects == []
