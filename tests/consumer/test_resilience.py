"""Crashes, joins, leaves, faults and backpressure, against a real broker
and the simulator, with real `tokenmill consume` processes."""

from __future__ import annotations

import random
import threading
import time

import pytest

from schemas import Completion, Failure
from tests.consumer.pipeline import (
    ConsumerProcess,
    committed_records,
    consumer_progress,
    create_run,
    duplicates,
    make_prompts,
    publish,
    sim_metrics,
    wait_until,
)
from tokenmill.devstack.processes import free_port
from tokenmill.simulator import SimulatorConfig, SimulatorProcess, running_simulator

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# ~0.2-0.6 s per request: slow enough that crashes catch work in flight.
PACED = SimulatorConfig(decode_rate=200.0, length_median=60, length_sigma=0.4, length_max=200,
                        max_running_requests=256, prefill_rate=0)


def _check_exactly_once(settings, run_id, prompts) -> list:
    records = committed_records(settings, run_id)
    assert duplicates(records) == {}
    assert {r.id for r in records} == {p.id for p in prompts}
    return records


def test_kill_9_and_restart_repeatedly(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=4)
    prompts = make_prompts(run_id, 1200)
    publish(settings, spec, prompts)
    rng = random.Random(7)
    concurrency = 24
    with running_simulator(PACED) as url:
        steady = ConsumerProcess(settings, run_id, url, "steady", tmp_path, "--until-done",
                                 "--concurrency", str(concurrency)).start()
        victim = ConsumerProcess(settings, run_id, url, "victim", tmp_path, "--until-done",
                                 "--concurrency", str(concurrency)).start()
        kills = 0
        try:
            for _ in range(4):
                time.sleep(rng.uniform(1.0, 3.0))
                if not victim.running():
                    break
                victim.kill()
                kills += 1
                victim.start()
            assert steady.wait(240) == 0, steady.log()[-3000:]
            assert victim.wait(120) == 0, victim.log()[-3000:]
        finally:
            steady.stop()
            victim.stop()
        served = sim_metrics(url)["sglang:num_requests_total"]
    assert kills >= 2
    records = _check_exactly_once(settings, run_id, prompts)
    assert all(isinstance(r, Completion) for r in records)
    wasted = served - len(records)
    # Lost work per crash is bounded by the in-flight window: the requests in
    # flight plus the results waiting for the next commit (0.5 s at ~80 req/s).
    window = concurrency * 2 + 80
    print(f"kills={kills} served={served:.0f} committed={len(records)} wasted={wasted:.0f}")
    assert 0 <= wasted <= kills * window


def test_third_consumer_joins_mid_run_without_stopping_the_others(settings, run_id,
                                                                   tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=6)
    prompts = make_prompts(run_id, 1500)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        first = [ConsumerProcess(settings, run_id, url, f"orig{i}", tmp_path, "--until-done",
                                 "--concurrency", "12").start() for i in range(2)]
        try:
            wait_until(lambda: consumer_progress(settings, run_id).generated > 200, 60,
                       "first results")
            joined_at = time.time()
            late = ConsumerProcess(settings, run_id, url, "late", tmp_path, "--until-done",
                                   "--concurrency", "12").start()
            wait_until(lambda: any(e["partitions"] for e in late.events("partitions assigned")),
                       20, "partitions for the late consumer")
            received_in = time.time() - joined_at
            for worker in [*first, late]:
                assert worker.wait(240) == 0, worker.log()[-3000:]
        finally:
            for worker in [*first]:
                worker.stop()
    records = _check_exactly_once(settings, run_id, prompts)
    assert received_in < 15
    assert any(r.instance == "late" for r in records)
    for worker in first:
        # Incremental rebalancing: a revocation never took all of a worker's partitions.
        for revoked in worker.events("partitions revoked")[:-1]:
            assert revoked["owned"], f"{worker.instance} lost every partition: stop-the-world"
    by_instance_after = {r.instance for r in records if r.latency_s >= 0}
    assert {"orig0", "orig1"} <= by_instance_after


def test_sigterm_drains_and_partitions_move(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=6)
    prompts = make_prompts(run_id, 1200)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        workers = [ConsumerProcess(settings, run_id, url, f"w{i}", tmp_path, "--until-done",
                                   "--concurrency", "12").start() for i in range(3)]
        try:
            wait_until(lambda: consumer_progress(settings, run_id).generated > 200, 60,
                       "first results")
            leaver = workers[2]
            leaver.terminate()
            assert leaver.wait(60) == 0, leaver.log()[-3000:]
            # Others are there: it hands its partitions over at once.
            assert [e["hand_over"] for e in leaver.events("stopping")] == [True]
            for worker in workers[:2]:
                assert worker.wait(240) == 0, worker.log()[-3000:]
        finally:
            for worker in workers:
                worker.stop()
    _check_exactly_once(settings, run_id, prompts)
    moved = set()
    for worker in workers[:2]:
        for event in worker.events("partitions assigned")[1:]:
            moved |= set(event["partitions"])
    leaver_had = set().union(*(set(e["partitions"]) for e in workers[2].events("partitions assigned")))
    assert leaver_had and leaver_had <= moved


def test_faults_are_retried_and_too_long_prompts_fail_at_once(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=3)
    prompts = make_prompts(run_id, 600, long_every=50)
    publish(settings, spec, prompts)
    faulty = SimulatorConfig(zero_delay=True, length_median=40, length_max=120,
                             error_rate=0.1, abort_rate=0.05, stall_rate=0.02, stall_seconds=5,
                             context_length=32768)
    with running_simulator(faulty) as url:
        worker = ConsumerProcess(settings, run_id, url, "f0", tmp_path, "--until-done",
                                 "--concurrency", "32", "--max-attempts", "10",
                                 "--retry-base", "0.05", "--request-timeout", "1").start()
        try:
            assert worker.wait(240) == 0, worker.log()[-3000:]
        finally:
            worker.stop()
    records = _check_exactly_once(settings, run_id, prompts)
    failures = [r for r in records if isinstance(r, Failure)]
    too_long = {p.id for p in prompts if len(p.messages[0].content) > 100_000}
    assert {f.id for f in failures} == too_long
    assert all(f.failure == "prompt_too_long" and f.attempts == 1 and f.status == 400
               for f in failures)
    state = consumer_progress(settings, run_id)
    assert state.consumer_total("retries") > 20
    assert state.consumer_counter("failures_by_kind") == {"prompt_too_long": len(too_long)}
    assert max(r.attempts for r in records) > 1


def test_server_down_pauses_without_failures(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=2)
    prompts = make_prompts(run_id, 400)
    publish(settings, spec, prompts)
    sim = SimulatorProcess(PACED, port=free_port())
    url = sim.start()
    worker = ConsumerProcess(settings, run_id, url, "d0", tmp_path, "--until-done",
                             "--concurrency", "16", "--max-attempts", "2").start()
    try:
        wait_until(lambda: consumer_progress(settings, run_id).generated > 50, 60, "progress")
        sim.kill()
        time.sleep(6)
        assert worker.running()
        sim.start()
        assert worker.wait(240) == 0, worker.log()[-3000:]
    finally:
        worker.stop()
        sim.terminate()
    records = _check_exactly_once(settings, run_id, prompts)
    assert not [r for r in records if isinstance(r, Failure)]
    assert worker.events("SGLang server unavailable; pausing consumption")
    assert worker.events("SGLang server healthy again; resuming")


def test_in_flight_never_exceeds_the_cap(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=4)
    prompts = make_prompts(run_id, 500)
    publish(settings, spec, prompts)
    peak = 0.0
    stop = threading.Event()
    with running_simulator(PACED) as url:
        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                m = sim_metrics(url)
                peak = max(peak, m["sglang:num_running_reqs"] + m["sglang:num_queue_reqs"])
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        worker = ConsumerProcess(settings, run_id, url, "cap", tmp_path, "--until-done",
                                 "--concurrency", "8").start()
        try:
            assert worker.wait(240) == 0, worker.log()[-3000:]
        finally:
            stop.set()
            sampler.join(5)
            worker.stop()
    _check_exactly_once(settings, run_id, prompts)
    assert 6 <= peak <= 8
