"""A sink that lost its partitions never uploads for them again (README
Guarantees, 3, and the design's revoke rule), shown on a sink frozen while
it holds a batch: sink `a` talks to S3 through a recording proxy, which
freezes it (SIGSTOP) the moment its first upload has reached S3 and before
`a` hears back, so `a` holds an uploaded but uncommitted batch. Its session
expires, sink `b` takes every partition and persists the whole run. Then
`a` is woken (SIGCONT): from then on the proxy sees no write from it at all
(every partition is `b`'s and every record persisted: nothing of `a`'s is
legitimate any more), `a` never commits the batch it held, and S3 holds
every record exactly once (boto3 and kafka-python)."""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import pytest

from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_run,
    feed,
    make_spec,
    publish_done,
    s3_objects,
    sink_env,
    start_sink,
    variant,
    wait,
    wait_for,
)
from tests.sink.test_crash import _log_events
from tokenmill.progress import read_run_progress

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(300)]

ARGS = ("--batch-size", "15", "--max-batch-age", "1", "--session-timeout", "6",
        "--create-bucket", "--until-done")
PARTITIONS = 4
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class Write:
    method: str
    key: str
    began: float  # when its request line and headers had arrived
    answered: float = 0.0  # when the store's answer came (0: not yet)
    status: int = 0


@dataclass
class Recorder:
    """What one sink asked of S3, through the proxy: every write;
    `freeze_pid` is SIGSTOPped after its first object upload has reached S3,
    before the answer goes back."""

    freeze_pid: int = 0
    writes: list[Write] = field(default_factory=list)
    frozen_at: float = 0.0
    held_key: str = ""
    froze: threading.Event = field(default_factory=threading.Event)

    def writes_begun_after(self, since: float) -> list[Write]:
        return [w for w in self.writes if w.began >= since]

    def in_flight_across_the_freeze(self, woken_at: float) -> list[Write]:
        """Writes begun before the freeze and answered after the wake-up:
        sent side by side with the one the freeze held, their bodies reached
        the proxy only once the process ran again (ci41)."""
        return [w for w in self.writes if w.began < self.frozen_at and w.answered >= woken_at]


@contextmanager
def recording_s3(upstream: str, recorder: Recorder) -> Iterator[str]:
    """An S3 endpoint that forwards every request to `upstream` unchanged
    (headers, signature and body) and notes the writes in `recorder`."""
    target = urlsplit(upstream)

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as boto3 expects

        def _forward(self) -> None:
            began = time.time()
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = unquote(urlsplit(self.path).path).split("/", 2)[-1]
            write = None
            if self.command in ("PUT", "POST", "DELETE") and "/" in key:
                write = Write(self.command, key, began)
                recorder.writes.append(write)
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                connection.request(self.command, self.path, body=body,
                                   headers=dict(self.headers.items()))
                answer = connection.getresponse()
                payload = answer.read()
            finally:
                connection.close()
            if write is not None:
                write.answered, write.status = time.time(), answer.status
            if (self.command == "PUT" and "partition=" in key and answer.status == 200
                    and recorder.freeze_pid and not recorder.froze.is_set()):
                os.kill(recorder.freeze_pid, signal.SIGSTOP)
                recorder.frozen_at, recorder.held_key = time.time(), key
                recorder.froze.set()
            self.send_response_only(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in HOP_BY_HOP:
                    self.send_header(name, value)
            # a HEAD answer has no body but says how long the object is
            self.send_header("Content-Length", answer.getheader("Content-Length", "0")
                             if self.command == "HEAD" else str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _owned(log_path) -> set[int]:
    """What the instance owned after its last assignment change."""
    changes = [e for e in _log_events(log_path)
               if e.get("event", "").startswith("partitions ") and "owned" in e]
    return set(changes[-1]["owned"]) if changes else set()


def test_a_frozen_sink_holding_a_batch_never_uploads_for_the_partitions_it_lost(
        settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=PARTITIONS)
    create_run(settings, spec)
    kinds = ["good"] * 6 + ["trivial", "failed"]
    records = [variant(spec, i, kinds[i % len(kinds)]) for i in range(240)]
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    recorder = Recorder()
    procs = {}
    thawed_at = 0.0
    with recording_s3(settings.s3_endpoint_url, recorder) as proxy:
        try:
            procs["a"] = start_sink(settings, run_id, *ARGS, "--instance", "a",
                                    log_path=logs["a"],
                                    env=sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=proxy))
            recorder.freeze_pid = procs["a"].pid
            procs["b"] = start_sink(settings, run_id, *ARGS, "--instance", "b",
                                    log_path=logs["b"])
            # both own partitions before the records arrive (with KIP-848 the
            # first to join would otherwise take everything)
            wait_for(lambda: _owned(logs["a"]) and _owned(logs["b"])
                     and len(_owned(logs["a"]) | _owned(logs["b"])) == PARTITIONS, 60,
                     "both sinks assigned")
            held_by_a = _owned(logs["a"])
            feed(settings, spec, records)
            publish_done(settings, run_id, len(records))
            assert recorder.froze.wait(60), "a never uploaded"
            try:
                # past its session: b takes a's partitions and persists the run
                wait_for(lambda: _owned(logs["b"]) == set(range(PARTITIONS)), 60,
                         "b owning every partition")
                assert wait(procs["b"], 90, logs["b"]) == 0, logs["b"].read_text()[-3000:]
                assert read_run_progress(settings, run_id).persisted == len(records)
            finally:
                thawed_at = time.time()
                os.kill(procs["a"].pid, signal.SIGCONT)
            assert wait(procs["a"], 90, logs["a"]) == 0, logs["a"].read_text()[-3000:]
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                    proc.wait(10)
    held_partition = int(recorder.held_key.split("partition=")[1].split("/")[0])
    print(f"a held {recorder.held_key}; its writes {recorder.writes}")
    # a held an uploaded, uncommitted batch of one of its partitions when frozen
    assert held_partition in held_by_a
    # (uploads of several partitions may be in flight at once; its start-up
    # store check wrote scratch keys of its own before them)
    assert recorder.held_key in {w.key for w in recorder.writes if w.method == "PUT"}
    mine = read_run_progress(settings, run_id).sinks.get("a")
    assert mine is None or mine.s3_objects == 0, mine  # never committed by a
    assert not [e for e in _log_events(logs["a"]) if e.get("event") == "batch committed"]
    # woken, it began no write to S3 again: the partitions were b's
    assert recorder.writes_begun_after(thawed_at) == []
    # an upload begun before the freeze that reached S3 only after the wake-up
    # (uploads run side by side) was refused: b had written that key first
    # (conditional writes)
    late = recorder.in_flight_across_the_freeze(thawed_at)
    assert all(w.status == 412 for w in late), late
    # the held object is b's now (pinned to a's key), every record once
    in_s3, _ = assert_exactly_once(settings, run_id, {r.id for r in records})
    assert recorder.held_key in {o.key for o in s3_objects(settings)}
    assert in_s3
