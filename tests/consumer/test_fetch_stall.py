"""A worker whose Kafka client stops fetching, as librdkafka was seen to do
to a sink after a broker restart (nothing outstanding, nothing timing out):
once a held partition has been silent past --fetch-stall while the worker
fetches and committed prompts wait for it, the worker exits with one line,
and its restart finishes the run exactly once. The stop is injected
(tests/faults.py pauses the consumer's partitions behind the worker's back)."""

from __future__ import annotations

import pytest

from sglang_sim import running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    check_exactly_once,
    create_run,
    make_prompts,
    publish,
    wait_until,
)
from tests.faults import assert_fetch_stall_exit

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(300)]

STALL_S = 5.0


def test_a_worker_whose_client_stopped_fetching_exits_and_its_restart_finishes(
        settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=3)
    prompts = make_prompts(run_id, 150)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        # one slot (no fleet balancing): no later member fetches behind the stop
        first = ConsumerProcess(settings, run_id, url, "w", tmp_path, "--concurrency", "8",
                                "--no-fleet-balancing", "--fetch-stall", str(STALL_S),
                                faults=("--stop-fetching-at", "transaction.committed:2")).start()
        wait_until(lambda: first.events("fault injection: fetching stopped"), 60,
                   "the client's fetching stopped")
        assert first.wait(120) == 1, first.log()[-3000:]
        # the limit and two looks, 2.5 s apart: about 10 s
        assert_fetch_stall_exit(first.log(), STALL_S, most_s=3 * STALL_S)

        again = ConsumerProcess(settings, run_id, url, "w", tmp_path, "--concurrency", "8",
                                "--until-done").start()
        try:
            assert again.wait(180) == 0, again.log()[-3000:]
        finally:
            again.stop()
    check_exactly_once(settings, run_id, prompts)
