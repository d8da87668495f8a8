"""A restarted worker with nothing undecided starts at once (README
Guarantees, 6): a worker stopped cleanly beside a worker that goes on
committing is started again. From its imports to the first request its
GPU's server sees, the time its main thread spent waiting on others (not
running, not waiting for a CPU) is what a start costs (tests/restart_timing.py),
far below the ~20 s that a read waiting for an undecided transaction adds
(`tests/consumer/test_liveness.py`)."""

from __future__ import annotations

import time

import msgspec
import pytest

from sglang_sim import running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    consumer_progress,
    create_run,
    make_prompts,
    publish,
    wait_until,
)
from tests.restart_timing import ENTRY, KAFKA_START_S, first_line_at, imported, waited_s

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# One slot per worker, partitions shared by the group's assignor: with fleet
# balancing a worker alone opens a slot per partition, and a newcomer gets
# one only when a donation drains (a look every few seconds): that is the
# fleet's pace (tests/consumer/test_fleet.py), not the start's.
ONE_SLOT = ("--no-fleet-balancing", "--concurrency", "8")


def test_a_restarted_worker_with_nothing_undecided_starts_at_once(settings, run_id,
                                                                  tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=4)
    prompts = make_prompts(run_id, 1000)
    publish(settings, spec, prompts)
    requests = tmp_path / "requests-b.jsonl"
    with running_simulator(PACED) as url_a:
        other = ConsumerProcess(settings, run_id, url_a, "a", tmp_path, *ONE_SLOT).start()
        again = None
        try:
            with running_simulator(PACED) as url_b:
                first = ConsumerProcess(settings, run_id, url_b, "b", tmp_path,
                                        *ONE_SLOT).start()

                def b_committed() -> bool:
                    mine = consumer_progress(settings, run_id).consumers.get("b")
                    return mine is not None and mine.completions > 20
                wait_until(b_committed, 120, "b's first commits")
                first.terminate()
                assert first.wait(60) == 0, first.log()[-3000:]
            # b stopped cleanly: its last transaction committed, nothing of it
            # is undecided; a goes on committing (its transactions open and close)
            assert other.running()
            left = len(prompts) - consumer_progress(settings, run_id).generated
            assert left > 300, f"too little of the run left for the restart ({left})"
            logged = msgspec.structs.replace(PACED, request_log=str(requests))
            with running_simulator(logged) as url_b:
                again = ConsumerProcess(settings, run_id, url_b, "b", tmp_path, *ONE_SLOT)
                again.args[again.args.index("tokenmill.cli")] = ENTRY
                since = again.mark()
                launched = time.time()
                again.start()
                first_request = first_line_at(requests, 60)
                wall, waited = waited_s(imported(again.events("imported", since)),
                                        again.proc.pid)
                again.terminate()
                assert again.wait(60) == 0, again.log()[-3000:]
        finally:
            other.stop()
            if again is not None:
                again.stop()
    print(f"first request {first_request - launched:.2f}s after launch, "
          f"{wall:.2f}s after the imports, waited {waited:.2f}s")
    assert waited <= KAFKA_START_S, (wall, waited)
