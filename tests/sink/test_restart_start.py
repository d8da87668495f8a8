"""A restarted sink with nothing undecided starts at once (README
Guarantees, 6): a sink stopped cleanly beside a sink that goes on
committing, while records keep arriving, is started again. From its imports
to its first upload (committed), the time its main thread spent waiting on
others (not running, not waiting for a CPU) is what a start costs
(tests/restart_timing.py) plus the batch's age limit, far below the ~20 s
that a read waiting for an undecided transaction adds."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tests.consumer.pipeline import event_time
from tests.restart_timing import ENTRY, KAFKA_START_S, imported, waited_s
from tests.sink.sink_helpers import (
    REPO,
    create_run,
    feed,
    good,
    make_spec,
    sink_env,
    start_sink,
    wait,
    wait_for,
)
from tests.sink.test_crash import _log_events

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(300)]

MAX_BATCH_AGE_S = 1.0
ARGS = ("--batch-size", "15", "--max-batch-age", str(MAX_BATCH_AGE_S), "--session-timeout", "6",
        "--create-bucket")


class Feeder:
    """Commits records to `.completions` (a few per transaction) until stopped."""

    def __init__(self, settings, spec) -> None:  # type: ignore[no-untyped-def]
        self.settings, self.spec = settings, spec
        self.fed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = [good(self.spec, i) for i in range(self.fed, self.fed + 20)]
            self.fed += feed(self.settings, self.spec, batch, per_transaction=5,
                             with_aborted=False)
            self._stop.wait(0.2)  # the pace of the records' arrival

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def _commits(log_path, since: float = 0.0) -> list[dict]:
    return [e for e in _log_events(log_path)
            if e.get("event") == "batch committed" and event_time(e) >= since]


def test_a_restarted_sink_with_nothing_undecided_starts_at_once(settings, run_id,
                                                                tmp_path) -> None:
    spec = make_spec(run_id, partitions=4)
    create_run(settings, spec)
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b", "b-again")}
    feeder = Feeder(settings, spec)
    procs = {}
    try:
        procs = {name: start_sink(settings, run_id, *ARGS, "--instance", name,
                                  log_path=logs[name]) for name in ("a", "b")}
        wait_for(lambda: _commits(logs["a"]) and _commits(logs["b"]), 120,
                 "both sinks uploading")
        procs["b"].terminate()
        # b stopped cleanly: its last transaction committed, nothing of it is
        # undecided; a goes on committing, records go on arriving
        assert wait(procs["b"], 60, logs["b"]) == 0
        launched = time.time()
        with logs["b-again"].open("ab") as out:
            procs["b-again"] = subprocess.Popen(
                [sys.executable, "-m", ENTRY, "sink", "--run", run_id, *ARGS, "--instance", "b"],
                env=sink_env(settings), stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 60
        while not _commits(logs["b-again"]):
            assert time.monotonic() < deadline, "no upload within 60 s of the restart"
            time.sleep(0.01)  # poll of a wait loop
        mark = imported(_log_events(logs["b-again"]))
        imported_after = mark["at"] - launched
        wall, waited = waited_s(mark, procs["b-again"].pid)
        # what passed since the upload was committed counts as waiting: taken off
        since_upload = time.time() - event_time(_commits(logs["b-again"])[0])
        wall, waited = wall - since_upload, waited - since_upload
        procs["b-again"].terminate()
        assert wait(procs["b-again"], 60, logs["b-again"]) == 0
    finally:
        feeder.stop()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    print(f"first upload committed {wall + imported_after:.2f}s after launch, "
          f"{wall:.2f}s after the imports, waited {waited:.2f}s")
    # a batch is sealed by count or, at the latest, by age
    assert waited <= KAFKA_START_S + MAX_BATCH_AGE_S, (wall, waited)
