"""The sink as a subprocess: killed between an upload and its commit, and
stopped with SIGTERM; after a restart every record is in exactly one place."""

from __future__ import annotations

import signal

import msgspec
import pytest

from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_run,
    feed,
    good,
    make_spec,
    publish_done,
    s3_objects,
    start_sink,
    variant,
    wait,
    wait_for,
)
from tokenmill.progress import read_run_progress

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(150)]

FAST = ("--batch-size", "10", "--max-batch-age", "1", "--session-timeout", "6",
        "--create-bucket", "--instance", "solo")


def _log_events(path) -> list[dict]:
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(msgspec.json.decode(line))
        except msgspec.DecodeError:
            pass
    return events


def test_kill_between_upload_and_commit_then_restart(settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=3)
    create_run(settings, spec)
    kinds = ["good"] * 8 + ["length", "trivial"]
    records = [variant(spec, i, kinds[i % len(kinds)]) for i in range(240)]
    total = feed(settings, spec, records)
    publish_done(settings, run_id, total)
    log = tmp_path / "sink.log"

    # First life: dies (as after kill -9) in its 5th flush transaction, after the
    # round's uploads and its DLQ records reached the broker, before the commit.
    first = start_sink(settings, run_id, *FAST, log_path=log, kill_at="transaction.offsets_sent:5")
    assert wait(first, 60, log) == 137, log.read_text()[-3000:]
    assert "fault injection: killed" in log.read_text()
    uploaded_before_restart = {o.key: [line["id"] for line in o.lines]
                               for o in s3_objects(settings)}
    assert len(uploaded_before_restart) >= 5
    committed = read_run_progress(settings, run_id).persisted
    assert committed < total  # the crash left work uncommitted

    # Second life: dies again, in the middle of the replay.
    second = start_sink(settings, run_id, *FAST, log_path=log, kill_at="transaction.committing:4")
    assert wait(second, 60, log) == 137

    # Third life: finishes the run.
    third = start_sink(settings, run_id, *FAST, "--until-done", log_path=log)
    assert wait(third, 90, log) == 0, log.read_text()[-3000:]

    assert_exactly_once(settings, run_id, {r.id for r in records})
    objects = {o.key: [line["id"] for line in o.lines] for o in s3_objects(settings)}
    # Every object the crashed lives uploaded was replayed to the same records.
    for key, ids in uploaded_before_restart.items():
        assert objects[key] == ids
    pinned = [e for e in _log_events(log) if e.get("event") == "batch pinned to an earlier object"]
    assert pinned, "the restart found the uncommitted objects"
    # The counters, committed with the work, are exact across the crashes.
    progress = read_run_progress(settings, run_id)
    assert progress.persisted == total
    assert progress.sinks["solo"].s3_records == len([i for i in objects.values() for _ in i])


def test_sigterm_finishes_commits_and_exits_zero(settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(150)]
    feed(settings, spec, records[:100])
    log = tmp_path / "sink.log"
    proc = start_sink(settings, run_id, *FAST, log_path=log)
    wait_for(lambda: read_run_progress(settings, run_id).persisted >= 40, 60,
             "some committed batches")
    proc.send_signal(signal.SIGTERM)
    assert wait(proc, 30, log) == 0
    events = [e.get("event") for e in _log_events(log)]
    assert "sink stopped" in events

    feed(settings, spec, records[100:])
    publish_done(settings, run_id, len(records))
    again = start_sink(settings, run_id, *FAST, "--until-done", log_path=log)
    assert wait(again, 60, log) == 0
    assert_exactly_once(settings, run_id, {r.id for r in records})
    assert read_run_progress(settings, run_id).persisted == len(records)
