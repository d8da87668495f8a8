"""Two sink instances on one run: one is killed, or frozen past its session
(a zombie that wakes up after its partitions moved), mid-run. Every record
ends up exactly once in S3 ∪ DLQ."""

from __future__ import annotations

import re
import signal
import threading

import boto3
import pytest

from sink.service import SinkService
from tests.gate import Gate
from tests.rebalance import STALE_MEMBER, Group
from tests.service_process import log_events
from tests.sink.sink_helpers import (
    ServiceThread,
    assert_exactly_once,
    create_bucket,
    create_run,
    feed,
    good,
    make_service,
    make_spec,
    publish_done,
    sink_env,
    start_sink,
    variant,
    wait,
    wait_for,
)
from tokenmill.kafka import topics
from tokenmill.progress import read_run_progress

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(150)]

ARGS = ("--batch-size", "15", "--max-batch-age", "1", "--session-timeout", "6",
        "--create-bucket", "--until-done")


def _records(spec, n):
    kinds = ["good"] * 6 + ["trivial", "failed"]
    return [variant(spec, i, kinds[i % len(kinds)]) for i in range(n)]


def _log_events(log_path, since: int = 0) -> list[dict]:
    return log_events(log_path.read_text()[since:])


def _ownership(log_path) -> list[set[int]]:
    """What the instance owned after each assignment change, in order."""
    return [set(e["owned"]) for e in _log_events(log_path)
            if e.get("event", "").startswith("partitions ")]


def _owned(log_path) -> set[int]:
    history = _ownership(log_path)
    return history[-1] if history else set()


def _committed_by(settings, run_id, instance) -> bool:
    mine = read_run_progress(settings, run_id).sinks.get(instance)
    return bool(mine and mine.s3_records + mine.dlq_records)


def _start_pair(settings, run_id, tmp_path, gate: Gate | None = None):
    """Sinks a and b, both owning partitions (their S3 calls through `gate`)."""
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    procs = {name: start_sink(settings, run_id, *ARGS, "--instance", name, log_path=logs[name],
                              env=sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=gate.url(name))
                              if gate else None)
             for name in ("a", "b")}
    wait_for(lambda: _owned(logs["a"]) and _owned(logs["b"])
             and len(_owned(logs["a"]) | _owned(logs["b"])) == 4, 60, "both instances assigned")
    return procs, logs


def test_one_instance_killed_mid_run(settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=4)
    create_run(settings, spec)
    records = _records(spec, 480)
    # Both own partitions before the first records arrive: with KIP-848 the
    # first member to join would otherwise take everything at once.
    procs, logs = _start_pair(settings, run_id, tmp_path)
    feed(settings, spec, records[:240])
    wait_for(lambda: _committed_by(settings, run_id, "a"), 60, "a's first commits")
    # more records arrive, in a few transactions, while a dies and b takes over
    arriving = threading.Event()

    def more() -> None:
        for start in range(240, len(records), 40):
            feed(settings, spec, records[start:start + 40], per_transaction=10,
                 with_aborted=False)
            arriving.set()

    feeder = threading.Thread(target=more, daemon=True)
    feeder.start()
    assert arriving.wait(60)
    procs["a"].send_signal(signal.SIGKILL)
    assert procs["a"].wait(10) == -signal.SIGKILL
    feeder.join(60)
    publish_done(settings, run_id, len(records))

    assert wait(procs["b"], 90, logs["b"]) == 0, logs["b"].read_text()[-3000:]
    assert {0, 1, 2, 3} in _ownership(logs["b"])  # took over the killed instance's partitions
    assert_exactly_once(settings, run_id, {r.id for r in records})
    assert read_run_progress(settings, run_id).persisted == len(records)


def test_a_frozen_instance_wakes_up_after_its_partitions_moved(settings, run_id,
                                                                tmp_path) -> None:
    """a is frozen past its session with an upload in flight, which lands
    in S3 while it is frozen: an object uploaded and never committed. b
    takes its partitions over and commits them. Woken up, a's late commit
    is refused (its group membership is stale) or its partitions are
    declared lost; what it uploaded counts for nothing."""
    spec = make_spec(run_id, partitions=4)
    create_run(settings, spec)
    records = _records(spec, 480)
    objects = f"/{settings.s3_bucket}/{run_id}/partition="  # batches, not the store check's

    def puts(caller: str | None = None) -> int:
        return sum(1 for r in gate.answered if r.method == "PUT" and r.status == 200
                   and r.path.startswith(objects) and caller in (None, r.caller))

    with Gate(settings.s3_endpoint_url or "") as gate:
        procs, logs = _start_pair(settings, run_id, tmp_path, gate)
        feed(settings, spec, records[:240])
        wait_for(lambda: _committed_by(settings, run_id, "a"), 60, "a's first commits")
        uploads = gate.hold(callers={"a"}, paths=(objects,), methods={"PUT"})
        feed(settings, spec, records[240:360])
        gate.wait(lambda: gate.count("a").held, 60, "an upload of a's in flight")
        procs["a"].send_signal(signal.SIGSTOP)  # frozen mid-run, past its session timeout
        try:
            before = puts("a")
            uploads.release()  # its objects land in S3 while it is frozen
            gate.wait(lambda: not gate.count("a").pending, 60, "a's uploads done")
            late = puts("a") - before
            wait_for(lambda: _owned(logs["b"]) == {0, 1, 2, 3}, 60, "b owns every partition")
            mark = len(logs["a"].read_text())
        finally:
            procs["a"].send_signal(signal.SIGCONT)
        refused = gate.wait(lambda: [e for e in _log_events(logs["a"], mark)
                                     if e.get("event") == "transaction aborted"
                                     and re.search(STALE_MEMBER, e.get("cause", ""))
                                     or e.get("event") == "partitions lost"
                                     and e.get("partitions")], 120,
                            "a's late commit refused, or its partitions lost")
        feed(settings, spec, records[360:])
        publish_done(settings, run_id, len(records))

        assert wait(procs["b"], 90, logs["b"]) == 0, logs["b"].read_text()[-3000:]
        assert wait(procs["a"], 90, logs["a"]) == 0, logs["a"].read_text()[-3000:]
    assert_exactly_once(settings, run_id, {r.id for r in records})
    progress = read_run_progress(settings, run_id)
    assert progress.persisted == len(records)
    committed = sum(sink.s3_objects for sink in progress.sinks.values())
    # a's late objects were never committed: S3 took that many more
    # uploads than the sinks committed objects.
    assert late >= 1 and puts() - committed >= late, (puts(), committed, late, refused)


class _Recording(SinkService):
    """Notes, for each revoke, whether uploads were in flight when it came,
    and whether they were committed by the time the partitions were dropped.
    `revoking` is set as a revoke of some partition begins."""

    revokes: list[tuple[list[int], bool, int, int, bool]]
    revoking: threading.Event

    def _on_revoke(self, consumer, partitions) -> None:  # type: ignore[no-untyped-def]
        in_flight = self._rounds.in_flight is not None
        committed_before = self.progress.s3_objects
        if partitions:
            self.revoking.set()
        super()._on_revoke(consumer, partitions)
        self.revokes.append((sorted(tp.partition for tp in partitions), in_flight,
                             committed_before, self.progress.s3_objects,
                             self._rounds.in_flight is not None))


@pytest.mark.timeout(400)
def test_revoke_waits_for_the_upload_in_flight_and_commits_it(settings, run_id) -> None:
    """B joins while A's first upload is in flight and held until A's revoke
    begins: A's revoke callback lets the upload finish and commits it before
    giving up the partition; nothing is lost or written twice."""
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(40)]
    publish_done(settings, run_id, feed(settings, spec, records))
    create_bucket(settings)
    uploading = threading.Event()
    revoking = threading.Event()
    held_until_revoke: list[bool] = []
    slow = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")

    def slow_put(params, **_kwargs) -> None:
        if not uploading.is_set():
            uploading.set()
            # Held (in an upload thread) until B has joined and the group
            # takes a partition from A; generous for a loaded machine.
            held_until_revoke.append(revoking.wait(90))

    slow.meta.events.register("before-parameter-build.s3.PutObject", slow_put)
    a = make_service(settings, spec, instance="a", batch_size=10, max_batch_age_s=1,
                     s3_client=slow, service_class=_Recording)
    a.revokes, a.revoking = [], revoking
    first = ServiceThread(a)
    assert uploading.wait(60)
    b = make_service(settings, spec, instance="b", batch_size=10, max_batch_age_s=1)
    second = ServiceThread(b)
    first.join(120)
    second.join(120)

    assert held_until_revoke == [True], "b never took a partition from a within 90 s"
    revokes = [r for r in a.revokes if r[0]]
    assert revokes, "a never gave up a partition"
    _partitions, in_flight, before, after, still_in_flight = revokes[0]
    # The slow upload was in flight when the revoke came; it was committed
    # before the partition was released.
    assert in_flight and not still_in_flight
    assert before == 0 and after >= 1
    assert_exactly_once(settings, run_id, {r.id for r in records})
    assert read_run_progress(settings, run_id).persisted == len(records)


def test_a_second_process_with_the_same_instance_fences_the_first(settings, run_id,
                                                                    tmp_path) -> None:
    """Two sinks started with the same --instance (e.g. both defaulting to the
    host name): the newer one fences the older, which stops with a clear
    error; the newer one finishes the run alone, exactly once."""
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = _records(spec, 200)
    feed(settings, spec, records[:100])
    logs = {name: tmp_path / f"{name}.log" for name in ("old", "new")}
    old = start_sink(settings, run_id, *ARGS, "--instance", "same", log_path=logs["old"])
    wait_for(lambda: _committed_by(settings, run_id, "same"), 60, "the first one's commits")
    new = start_sink(settings, run_id, *ARGS, "--instance", "same", log_path=logs["new"])
    assert wait(old, 60, logs["old"]) == 1
    text = logs["old"].read_text()
    assert "another process took over transactional id tokenmill." in text
    assert "Traceback" not in text  # one line, not a traceback
    feed(settings, spec, records[100:])
    publish_done(settings, run_id, len(records))
    assert wait(new, 90, logs["new"]) == 0, logs["new"].read_text()[-3000:]
    assert_exactly_once(settings, run_id, {r.id for r in records})


def test_a_sink_given_partitions_as_it_closes_leaves_without_waiting(settings, run_id,
                                                                     tmp_path) -> None:
    """b stops and is held just before its consumer closes (crash point
    group.closing) while a leaves: the group moves a's partition to b, which
    is handed it inside close(). It will read nothing from it, so it leaves
    at once, instead of waiting for committed offsets its closing consumer
    cannot read (it waited 45 s, then failed: seen in this file's frozen
    test, b stopping as a's partitions came back to it)."""
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    release = tmp_path / "release"
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    a = start_sink(settings, run_id, *ARGS, "--instance", "a", log_path=logs["a"])
    b = start_sink(settings, run_id, *ARGS, "--instance", "b", log_path=logs["b"],
                   faults=("--hold-at", "group.closing", "--hold-until", str(release)))
    group = Group(settings, topics.sink_group(run_id), topics.completions_topic(run_id), 2)
    try:
        wait_for(lambda: _owned(logs["a"]) and _owned(logs["b"]), 60, "each owning one")
        moved = _owned(logs["a"])
        b.send_signal(signal.SIGTERM)
        wait_for(lambda: "fault injection: holding" in logs["b"].read_text(), 60,
                 "b held before its consumer closes")
        a.send_signal(signal.SIGTERM)
        assert wait(a, 60, logs["a"]) == 0, logs["a"].read_text()[-3000:]
        group.wait(lambda ms: [m.target for m in ms] == [frozenset({0, 1})], 30,
                   "a's partition moved to b, in the group's eyes")
        release.touch()
        assert wait(b, 30, logs["b"]) == 0, logs["b"].read_text()[-3000:]
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
    given = [e for e in _log_events(logs["b"])
             if e.get("event") == "partitions given while closing: left unread"]
    assert given and set(given[0]["partitions"]) == moved, logs["b"].read_text()[-3000:]
