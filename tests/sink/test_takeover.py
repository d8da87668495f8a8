"""A sink that takes over partitions whose last owner died inside a
transaction (its offsets sent, not committed) starts from the committed
offsets, once that transaction is aborted, never from the partitions'
beginning: no batch is committed twice, the counters are exact, and every
record is once in S3 or the DLQ. A CI run's sink that left the read to
librdkafka re-read a partition from offset 0 and called the run persisted
with 15 records unwritten (tokenmill/kafka/start_offsets.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_run,
    feed,
    make_spec,
    publish_done,
    start_sink,
    variant,
    wait,
)
from tests.sink.test_crash import _log_events
from tokenmill.progress import read_run_progress

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(240)]

ARGS = ("--batch-size", "10", "--max-batch-age", "1", "--session-timeout", "6",
        "--create-bucket")
UNDECIDED = "committed offsets not readable yet"


def test_a_sink_taking_over_from_one_killed_mid_commit_starts_at_the_committed_offsets(
        settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=3)
    create_run(settings, spec)
    kinds = ["good"] * 8 + ["length", "trivial"]
    records = [variant(spec, i, kinds[i % len(kinds)]) for i in range(240)]
    total = feed(settings, spec, records)
    publish_done(settings, run_id, total)
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"

    # Dies in its 4th flush transaction with the offsets sent: they stay
    # undecided until the transaction times out (20 s), the records committed
    # by its first three are behind them.
    first = start_sink(settings, run_id, *ARGS, "--instance", "first", log_path=first_log,
                       kill_at="transaction.offsets_sent:4")
    assert wait(first, 90, first_log) == 137, first_log.read_text()[-3000:]
    second = start_sink(settings, run_id, *ARGS, "--instance", "second", "--until-done",
                        log_path=second_log)
    assert wait(second, 150, second_log) == 0, second_log.read_text()[-3000:]

    events = _log_events(second_log)
    # the moment: it took the partitions over while the offsets were undecided
    assert any(UNDECIDED in e.get("event", "") for e in events), second_log.read_text()[-3000:]
    committed = Counter((e["partition"], e["first_offset"])
                        for log in (first_log, second_log) for e in _log_events(log)
                        if e.get("event") == "batch committed")
    assert [batch for batch, times in committed.items() if times > 1] == []
    assert_exactly_once(settings, run_id, {r.id for r in records})
    progress = read_run_progress(settings, run_id)
    assert progress.persisted == total
