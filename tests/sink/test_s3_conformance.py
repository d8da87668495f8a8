"""Conformance of the sink against the real object store (Ceph's S3 gateway,
tests/conftest.py `real_s3`): what real stores do and moto does not.

- racing conditional creates: exactly one wins, the others get 412;
- the zombie: a sink frozen with its upload in flight, its partition taken
  over; its conditional write lands after the new owner's and gets 412;
  nothing is duplicated;
- a write that landed but whose answer was lost: the retry gets 412, the
  sink replays pinned to the object (If-Match) and nothing is duplicated;
- the gateway killed (-9) with an upload in flight and restarted;
- 503 SlowDown and 500 at a rate: retried with backoff, `status` shows the
  failed attempts, nothing lost.

Recovery after a sink crash between upload and commit, read back by listing
the bucket, is `tests/sink/test_crash.py::test_kill_between_upload_and_commit_then_restart`
(it runs against the same store). Faults come from a proxy in front of the
store (tests/sink/s3_fault_proxy.py) or from killing a gateway of the test's
own on the session's cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devstack import ceph_rgw, processes
from sink import store_check
from sink.errors import ObjectConflict
from sink.s3_writer import S3Writer, make_client
from tests.sink.s3_fault_proxy import S3FaultProxy, Seen
from tests.sink.sink_helpers import (
    REPO,
    assert_exactly_once,
    create_bucket,
    create_run,
    feed,
    good,
    make_spec,
    publish_done,
    s3_objects,
    sink_env,
    start_sink,
    wait,
    wait_for,
)
from tests.sink.test_crash import _log_events
from tokenmill.progress import read_run_progress

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(240)]

ARGS = ("--batch-size", "20", "--max-batch-age", "1", "--session-timeout", "6",
        "--create-bucket", "--until-done")


def _object_put(seen: Seen) -> bool:
    """A PUT of a batch object (not of the start-up check's scratch key)."""
    return seen.method == "PUT" and "/partition=" in seen.path and "uploadId" not in seen.query


def _first(predicate):  # type: ignore[no-untyped-def]
    """The predicate, true for its first match only."""
    matched: list[bool] = []

    def once(seen: Seen) -> bool:
        if matched or not predicate(seen):
            return False
        matched.append(True)
        return True

    return once


def _object_puts(proxy: S3FaultProxy) -> list[int]:
    """The answers to batch-object PUTs (0: none reached the client)."""
    return [status for method, path, status in list(proxy.log)
            if method == "PUT" and "/partition=" in path]


def _events(log_path: Path, event: str) -> list[dict]:
    return [e for e in _log_events(log_path) if e.get("event") == event]


def _assert_listing_is_exact(settings, run_id: str, expected: set[str]) -> None:
    """Listing the bucket right after the run: every object once, ranges that
    do not overlap, and every record in exactly one place."""
    objects = s3_objects(settings)
    keys = [o.key for o in objects]
    assert len(keys) == len(set(keys))
    by_partition: dict[str, list[tuple[int, int]]] = {}
    for o in objects:
        by_partition.setdefault(o.metadata["partition"], []).append(
            (int(o.metadata["first-offset"]), int(o.metadata["last-offset"])))
    for ranges in by_partition.values():
        ranges.sort()
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), ranges
    assert_exactly_once(settings, run_id, expected)


def test_the_store_honours_conditional_writes_as_the_start_up_check_finds(
        settings, real_s3) -> None:
    create_bucket(settings)
    writer = S3Writer(client=make_client(endpoint_url=settings.s3_endpoint_url,
                                         region="us-east-1"), bucket=settings.s3_bucket)
    profile = store_check.check(writer, endpoint=settings.s3_endpoint_url, region="us-east-1",
                                prefix="", run="conformance", instance="t",
                                max_batch_bytes=64 << 20)
    assert profile is not None
    assert profile.conditional_create and profile.conditional_replace and not profile.missing
    if real_s3.name == "ceph":  # what Ceph 16 (Debian bookworm) does, as found here
        assert profile.etag_unquoted and not profile.multipart_conditions
    listed = writer.client.list_objects_v2(Bucket=settings.s3_bucket)
    assert listed.get("KeyCount", 0) == 0  # the scratch key is gone


def test_racing_conditional_creates_one_wins_the_others_get_412(settings) -> None:
    create_bucket(settings)
    writer = S3Writer(client=make_client(endpoint_url=settings.s3_endpoint_url,
                                         region="us-east-1", max_pool=16),
                      bucket=settings.s3_bucket)

    def create(key: str, n: int) -> str:
        try:
            writer.upload(key, f"writer {n}\n".encode(), {}, content_type="text/plain")
            return f"writer {n}\n"
        except ObjectConflict:
            return "412"

    for trial in range(5):
        key = f"race/{trial}.jsonl"
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda n: create(key, n), range(8)))  # noqa: B023
        winners = [a for a in answers if a != "412"]
        assert len(winners) == 1, answers
        body = writer.client.get_object(Bucket=settings.s3_bucket, Key=key)["Body"].read()
        assert body.decode() == winners[0]


def test_a_zombie_sinks_conditional_write_gets_412_and_nothing_is_duplicated(
        settings, run_id, tmp_path) -> None:
    """Sink A's first upload is parked in the proxy; A freezes past its
    session; B takes the partition over and writes the key; then A's write
    reaches the store, gets 412, and A wakes up to find the partition gone."""
    spec = make_spec(run_id, partitions=1)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(100)]
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    with S3FaultProxy(settings.s3_endpoint_url) as proxy:
        proxy.hold = _first(_object_put)
        a = start_sink(settings, run_id, *ARGS, "--instance", "za", log_path=logs["a"],
                       env=sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=proxy.url))
        b = None
        try:
            wait_for(lambda: _events(logs["a"], "partitions assigned"), 60, "A assigned")
            feed(settings, spec, records)
            publish_done(settings, run_id, len(records))
            assert proxy.held.wait(60), "A's upload never reached the store"
            a.send_signal(signal.SIGSTOP)  # frozen with its upload in flight
            b = start_sink(settings, run_id, *ARGS, "--instance", "zb", log_path=logs["b"])
            assert wait(b, 120, logs["b"]) == 0, logs["b"].read_text()[-3000:]
            proxy.release.set()  # A's write reaches the store, after B's
            wait_for(lambda: 412 in _object_puts(proxy), 30, "A's write answered")
        finally:
            a.send_signal(signal.SIGCONT)
        assert wait(a, 120, logs["a"]) == 0, logs["a"].read_text()[-3000:]
        assert _object_puts(proxy).count(412) == 1
    assert _events(logs["a"], "another writer owns this key: replaying the batch pinned to it")
    _assert_listing_is_exact(settings, run_id, {r.id for r in records})
    progress = read_run_progress(settings, run_id)
    assert progress.persisted == len(records)
    assert progress.sinks["zb"].s3_records == len(records)
    assert "za" not in progress.sinks or progress.sinks["za"].s3_records == 0


def test_a_write_whose_answer_was_lost_is_replayed_pinned(settings, run_id, tmp_path) -> None:
    """The store did the PUT, the answer never came back: botocore's retry
    gets 412, the sink probes the key, pins its batch to the object and
    replaces it with If-Match (Ceph 16: the ETag unquoted)."""
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(120)]
    feed(settings, spec, records)
    publish_done(settings, run_id, len(records))
    log = tmp_path / "sink.log"
    with S3FaultProxy(settings.s3_endpoint_url) as proxy:
        proxy.drop_after = _first(_object_put)
        sink = start_sink(settings, run_id, *ARGS, "--instance", "lost", log_path=log,
                          env=sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=proxy.url))
        assert wait(sink, 120, log) == 0, log.read_text()[-3000:]
        puts = _object_puts(proxy)
    assert 0 in puts and 412 in puts  # dropped, then the retry's 412
    assert _events(log, "another writer owns this key: replaying the batch pinned to it")
    assert _events(log, "batch pinned to an earlier object")
    _assert_listing_is_exact(settings, run_id, {r.id for r in records})


def test_the_gateway_killed_with_an_upload_in_flight_and_restarted(
        settings, real_s3, run_id, tmp_path) -> None:
    if real_s3.cluster is None:
        pytest.skip("needs the session's own Ceph cluster (TOKENMILL_TEST_REAL_S3_ENDPOINT_URL "
                    "is set)")
    cluster = real_s3.cluster
    port = processes.free_port()
    argv = ceph_rgw.gateway_command(cluster.config, f"t{uuid.uuid4().hex[:8]}", "127.0.0.1",
                                    port, cluster.home)
    gateway = ceph_rgw.Daemon(name="gw", pid=processes.spawn(argv, tmp_path / "gw.out"),
                              address=f"http://127.0.0.1:{port}", log=str(tmp_path / "gw.out"),
                              argv=argv, ports=[port])
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(120)]
    feed(settings, spec, records)
    publish_done(settings, run_id, len(records))
    log = tmp_path / "sink.log"
    try:
        ceph_rgw.wait_for_gateway(gateway, 60)
        with S3FaultProxy(gateway.address) as proxy:
            proxy.hold = _first(_object_put)
            sink = start_sink(settings, run_id, *ARGS, "--instance", "restart", log_path=log,
                              env=sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=proxy.url))
            assert proxy.held.wait(60), "no upload reached the gateway"
            processes.signal_group(gateway.pid, signal.SIGKILL)  # mid-upload
            assert processes.wait_gone(gateway.pid, 30)
            proxy.release.set()  # the parked upload meets a dead gateway
            wait_for(lambda: 0 in _object_puts(proxy), 30, "the upload failing")
            gateway = ceph_rgw.restart(gateway)  # same command, same cluster
            ceph_rgw.wait_for_gateway(gateway, 60)
            assert wait(sink, 180, log) == 0, log.read_text()[-3000:]
    finally:
        processes.stop(gateway.pid)
    assert "Traceback" not in log.read_text()
    _assert_listing_is_exact(settings, run_id, {r.id for r in records})
    assert read_run_progress(settings, run_id).sinks["restart"].upload_errors >= 1


def test_slowdown_and_500s_are_retried_status_shows_them_nothing_is_lost(
        settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(200)]
    feed(settings, spec, records)
    publish_done(settings, run_id, len(records))
    log = tmp_path / "sink.log"
    with S3FaultProxy(settings.s3_endpoint_url) as proxy:
        proxy.fail_rate = 0.2
        sink = start_sink(settings, run_id, *ARGS, "--instance", "slow", log_path=log,
                          env=sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=proxy.url))
        assert wait(sink, 180, log) == 0, log.read_text()[-3000:]
        injected = Counter(s for s in proxy.statuses() if s in (500, 503))
        # Faults on batch objects (probes, uploads) hit the sink's upload
        # client, whose failed attempts the sink counts; the start-up wait
        # and the store check have clients of their own.
        on_objects = [s for _, path, s in proxy.log if s in (500, 503) and "/partition=" in path]
    assert injected[503] and injected[500] and on_objects
    status = subprocess.run([sys.executable, "-m", "tokenmill.cli", "status", "--run", run_id,
                             "--json"], env=sink_env(settings), capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert status.returncode in (0, 1), status.stderr  # 1: a problem is reported
    (shown,) = [s for s in json.loads(status.stdout)["sinks"] if s["instance"] == "slow"]
    assert shown["upload_errors"] >= len(on_objects)
    assert shown["last_error"].startswith("HTTP 50")
    _assert_listing_is_exact(settings, run_id, {r.id for r in records})


def test_proxy_keeps_signatures(settings) -> None:
    """The proxy forwards requests byte for byte (SigV4 holds at the store)."""
    create_bucket(settings)
    with S3FaultProxy(settings.s3_endpoint_url) as proxy:
        client = make_client(endpoint_url=proxy.url, region="us-east-1")
        client.put_object(Bucket=settings.s3_bucket, Key="k", Body=os.urandom(2048),
                          Metadata={"a": "b"})
        head = client.head_object(Bucket=settings.s3_bucket, Key="k")
    assert head["ContentLength"] == 2048 and head["Metadata"] == {"a": "b"}
