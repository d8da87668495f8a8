"""A sink whose Kafka client stops fetching, as librdkafka was seen to after
a broker restart (a CI run's sink sat 15 minutes with the run's last records
waiting, nothing timing out): once a partition has been silent past
--fetch-stall while committed records wait for it, the sink exits with one
line, and the restart finishes the run exactly once. The stop is injected
(tests/faults.py pauses the consumer's partitions behind the service's back)."""

from __future__ import annotations

import time

import pytest

from tests.faults import assert_fetch_stall_exit
from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_run,
    feed,
    good,
    make_spec,
    publish_done,
    start_sink,
    wait,
    wait_for,
)
from tests.sink.test_crash import FAST

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(240)]

STALL_S = 5.0


def test_a_sink_whose_client_stopped_fetching_exits_and_its_restart_finishes(
        settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=3)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(150)]
    feed(settings, spec, records[:60])
    log = tmp_path / "sink.log"
    first = start_sink(settings, run_id, *FAST, "--fetch-stall", str(STALL_S), log_path=log,
                       faults=("--stop-fetching-at", "transaction.committed:2"))
    wait_for(lambda: "fault injection: fetching stopped" in log.read_text(), 60,
             "the client's fetching stopped")
    # committed records wait past where the stopped client would read
    total = 60 + feed(settings, spec, records[60:])
    publish_done(settings, run_id, total)
    waiting_since = time.monotonic()
    assert wait(first, 120, log) == 1, log.read_text()[-3000:]
    exited_after = time.monotonic() - waiting_since
    # silent once past the limit over 20 polls (0.5 s each: 10 s here), then
    # two looks 2.5 s apart: about 13 s (10 s apart, up to 30 s)
    assert_fetch_stall_exit(log.read_text(), STALL_S, most_s=20)
    assert exited_after < STALL_S + 60, exited_after  # the limit, two looks, not much more

    second = start_sink(settings, run_id, *FAST, "--until-done", log_path=log)
    assert wait(second, 120, log) == 0, log.read_text()[-3000:]
    assert_exactly_once(settings, run_id, {r.id for r in records})
