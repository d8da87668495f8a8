"""The sink's smaller jobs without Kafka or S3: probes, ownership, liveness."""

from __future__ import annotations

from concurrent.futures import Future

from schemas import SinkProgress
from sink.batcher import BatchLimits, ExistingObject
from sink.liveness import Liveness, busy_since
from sink.metrics import SinkMetrics
from sink.ownership import Ownership
from sink.probes import Probes
from sink.s3_attempts import S3Errors
from tokenmill.kafka.transactions import TransactionAborted


class Lookups:
    def __init__(self) -> None:
        self.futures: dict[int, Future[tuple[ExistingObject, ...]]] = {}

    def __call__(self, partition: int, offset: int) -> Future[tuple[ExistingObject, ...]]:
        future: Future[tuple[ExistingObject, ...]] = Future()
        self.futures[partition] = future
        return future


def _jobs() -> tuple[Probes, Ownership, Lookups, list[tuple[int, int]]]:
    seeks: list[tuple[int, int]] = []
    lookups = Lookups()
    probes = Probes(lookup=lookups, seek=lambda p, o: seeks.append((p, o)))
    ownership = Ownership(limits=BatchLimits(max_records=10), clock=lambda: 0.0,
                          metrics=SinkMetrics(), probes=probes,
                          seek=lambda p, o: seeks.append((p, o)))
    return probes, ownership, lookups, seeks


def test_an_answered_probe_pins_the_batch_and_reads_the_partition_again() -> None:
    probes, ownership, lookups, seeks = _jobs()
    ownership.assign([0, 1])
    probes.start(0, 7)
    probes.start(1, 9)
    assert 0 in probes and probes.partitions == [0, 1] and probes.busy_since() > 0
    found = ExistingObject(key="k", etag="e", size=1, first_offset=7, last_offset=12, records=4)
    lookups.futures[0].set_result((found,))
    probes.finish(ownership.batchers)
    assert seeks == [(0, 7)] and probes.partitions == [1]
    batcher = ownership.batchers[0]
    assert not batcher.needs_probe and not batcher.accepts(6) and batcher.accepts(7)
    batcher.add(7, line=b"x\n")
    assert batcher.current is not None and batcher.current.pinned_to == 12


def test_a_dropped_partition_forgets_its_probe_and_batcher() -> None:
    probes, ownership, lookups, seeks = _jobs()
    ownership.assign([0])
    probes.start(0, 3)
    ownership.drop([0], "revoked")
    lookups.futures[0].set_result(())
    probes.finish(ownership.batchers)
    assert ownership.batchers == {} and seeks == [] and 0 not in probes


def test_a_rewind_reads_again_from_the_oldest_uncommitted_batch_unless_leaving() -> None:
    _probes, ownership, _lookups, seeks = _jobs()
    ownership.assign([0, 1])
    for partition in (0, 1):
        ownership.batchers[partition].add(4, line=b"x\n")
        ownership.reached_end(partition)
    assert ownership.all_at_end() and ownership.pending_records == 2
    ownership.rewind(ownership.batchers[0], leaving=False)
    ownership.rewind(ownership.batchers[1], leaving=True)
    assert seeks == [(0, 4)] and not ownership.all_at_end() and ownership.pending_records == 0


class Committer:
    def __init__(self) -> None:
        self.abort = False
        self.committed: list[SinkProgress] = []

    def commit(self, batches: object, progress: SinkProgress) -> None:
        if self.abort:
            raise TransactionAborted("no")
        self.committed.append(progress)


def test_a_heartbeat_commits_the_counters_alone_and_an_aborted_one_changes_nothing() -> None:
    _probes, ownership, _lookups, _seeks = _jobs()
    ownership.assign([0, 1])
    now = [100.0]
    committer = Committer()
    errors = S3Errors()
    liveness = Liveness(progress=SinkProgress(run="r", instance="i", s3_records=5),
                        committer=committer, ownership=ownership, s3_errors=errors,
                        heartbeat_s=10.0, clock=lambda: now[0], last_commit=95.0)
    assert not liveness.due(100.0) and liveness.due(105.0)
    committer.abort = True
    liveness.heartbeat(uploading_since=0.0)
    assert liveness.progress.updated_at == 0.0 and not liveness.due(109.0)  # it tried
    committer.abort = False
    errors.note("HTTP 503 from S3")
    liveness.heartbeat(uploading_since=42.0, final=True)
    beat = committer.committed[-1]
    assert liveness.progress == beat and beat.s3_records == 5 and beat.stopped_at > 0
    assert (beat.partitions, beat.uploading_since, beat.upload_errors, beat.last_error) == (
        2, 42.0, 1, "HTTP 503 from S3")


def test_busy_since_is_the_earliest_call_in_flight() -> None:
    assert busy_since(0.0, 0.0) == 0.0
    assert busy_since(0.0, 12.0, 11.0) == 11.0
