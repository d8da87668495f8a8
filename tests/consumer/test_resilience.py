"""Crashes, joins, leaves, faults and backpressure, against a real broker
and the simulator, with real `tokenmill consume` processes."""

from __future__ import annotations

import threading
import time
from datetime import datetime

import msgspec
import pytest
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka.admin import KafkaAdminClient

from devstack.processes import free_port
from schemas import Completion, Failure, decode_completion
from sglang_sim import SimulatorConfig, SimulatorProcess, running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    Publisher,
    check_exactly_once,
    committed_results,
    consumer_progress,
    create_run,
    make_prompts,
    publish,
    sim_metrics,
    wait_until,
)
from tests.consumer.waste import Move, assignments, logged_moves, owned, stamped_by, waste
from tests.kafka_helpers import read_all
from tokenmill.kafka import clients, topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]




def _records_in_open_transaction(admin: KafkaAdminClient, transactional_id: str,
                                 offsets: AdminClient, topic: str) -> bool:
    """The transaction coordinator says this producer's transaction is open on
    `topic` (kafka-python), and some of its records are already in the log:
    a partition's high watermark is above its last stable offset."""
    found = admin.describe_transactions([transactional_id])[transactional_id]
    parts = [tp.partition for tp in found.topic_partitions if tp.topic == topic]
    if found.state.value != "Ongoing" or not parts:
        return False
    tps = [TopicPartition(topic, p) for p in parts]
    stable = offsets.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                  isolation_level=IsolationLevel.READ_COMMITTED)
    high = offsets.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                isolation_level=IsolationLevel.READ_UNCOMMITTED)
    return any(high[tp].result().offset > stable[tp].result().offset for tp in tps)


def _aborted_by(settings, run_id: str, instance: str) -> int:
    """Records of `instance` in the log that no read_committed reader sees:
    what a kill inside its open transaction left behind."""
    topic = topics.completions_topic(run_id)
    committed = {(r.partition, r.offset) for r in read_all(settings.bootstrap_servers, topic)}
    return sum(1 for r in read_all(settings.bootstrap_servers, topic, committed_only=False)
               if (r.partition, r.offset) not in committed
               and decode_completion(r.value).instance == instance)


def test_kill_9_and_restart_repeatedly(settings, run_id, tmp_path) -> None:
    """kill -9 while the victim's transaction is open (asked of the
    transaction coordinator with kafka-python), restart, repeat; at least one
    kill must have landed inside it: its records are in the log, and no
    read_committed reader ever sees them. The run is held unfinished: its
    prompts are published a few hundred ahead of the requests served, the
    last ones after the last kill. What the kills and the partitions' moves
    threw away is what the windows of the moves held (tests/consumer/waste.py):
    the victim's partitions at each kill, and each revoke or loss logged."""
    spec = create_run(settings, run_id, partitions=4)
    prompts = make_prompts(run_id, 1500)
    publisher = Publisher(settings, spec, prompts)
    concurrency = 24
    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    offsets = clients.admin(settings)
    topic = topics.completions_topic(run_id)
    victim_txn = topics.transactional_id(run_id, "consumer", "victim")
    request_log = tmp_path / "requests.jsonl"
    kill_moves: list[Move] = []
    started_at = time.time()
    # The group protocol's join, without the fleet's slots: with them a
    # restarted victim facing the small backlog this test keeps is rightly
    # held as a standby (tests/consumer/test_fleet.py), and no kill can land.
    solo = ("--until-done", "--concurrency", str(concurrency), "--no-fleet-balancing")
    with running_simulator(msgspec.structs.replace(PACED, request_log=str(request_log))) as url:
        steady = ConsumerProcess(settings, run_id, url, "steady", tmp_path, *solo).start()
        victim = ConsumerProcess(settings, run_id, url, "victim", tmp_path, *solo).start()
        kills = 0
        try:
            life = 0

            def victim_owns() -> bool:
                # the run stays unfinished while the victim (re)starts: the
                # prompts published stay 300 ahead of the requests served
                served = sim_metrics(url).get("sglang:num_requests_total", 0)
                publisher.ahead(int(served), 300)
                return not victim.running() or bool(owned(victim, life))
            while kills < 15 and victim.running():
                # bounded generously: a restart's start-up is the machine's
                wait_until(victim_owns, 180, "the victim owns partitions")
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not _records_in_open_transaction(
                        admin, victim_txn, offsets, topic):
                    pass
                if not victim.running():
                    break
                victim.kill()
                # the dead victim's log is whole; every request it sent is stamped
                held = owned(victim, life)
                killed_at = stamped_by(url)
                kills += 1
                kill_moves += [("victim", p, killed_at) for p in held]
                life = victim.mark()
                victim.start()
                if kills >= 2 and _aborted_by(settings, run_id, "victim"):
                    break
            publisher.rest()
            assert steady.wait(240) == 0, steady.log()[-3000:]
            assert victim.wait(120) == 0, victim.log()[-3000:]
        finally:
            steady.stop()
            victim.stop()
    assert kills >= 2
    hits = _aborted_by(settings, run_id, "victim")
    assert hits > 0, f"none of {kills} kills landed inside an open transaction of the victim"
    records = check_exactly_once(settings, run_id, prompts)
    assert all(isinstance(r, Completion) for r in records)
    workers = {"steady": steady, "victim": victim}
    moves = kill_moves + logged_moves(workers, started_at)
    found = waste(settings, run_id, prompts, spec.partitions, request_log, moves,
                  assignments(workers, started_at))
    print(f"kills={kills} wasted={found.wasted} aborted records={hits} windows at the kills "
          f"{[len(w) for w in found.windows[:len(kill_moves)]]}, at the other moves "
          f"{[len(w) for w in found.windows[len(kill_moves):]]}")
    # what each kill threw away lay in its window: the requests in flight and
    # the results waiting for the next commit on the partitions the victim held
    found.check()


def test_third_consumer_joins_mid_run_without_stopping_the_others(settings, run_id,
                                                                   tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=6)
    prompts = make_prompts(run_id, 2000)
    # Held: the late worker must find most of the run left (near the end the
    # fleet rightly keeps a newcomer as a standby), however long it takes to
    # start and to be given partitions on a loaded machine: until it has
    # some, the prompts published stay 600 ahead of the requests served.
    publisher = Publisher(settings, spec, prompts)
    publisher.to(600)
    # The group protocol's join, without the fleet's slots: with them, the
    # first two open a slot per partition within seconds, and a newcomer on
    # the same simulated GPU, facing a backlog this test keeps small, is
    # rightly kept as a standby (moving would not pay: tests/consumer/
    # test_fleet.py); whether it got partitions then raced that expansion.
    solo = ("--until-done", "--concurrency", "12", "--no-fleet-balancing")
    with running_simulator(PACED) as url:
        first = [ConsumerProcess(settings, run_id, url, f"orig{i}", tmp_path, *solo).start()
                 for i in range(2)]
        try:
            wait_until(lambda: consumer_progress(settings, run_id).generated > 200, 60,
                       "first results")
            late = ConsumerProcess(settings, run_id, url, "late", tmp_path, *solo).start()

            def late_assigned() -> bool:
                served = sim_metrics(url).get("sglang:num_requests_total", 0)
                publisher.ahead(int(served), 600)
                return any(e["partitions"] for e in late.events("partitions assigned"))
            # bounded generously: its start-up (imports, connecting) is the
            # machine's; the join itself is timed from its own log below
            wait_until(late_assigned, 180, "partitions for the late consumer")
            publisher.rest()
            for worker in [*first, late]:
                assert worker.wait(240) == 0, worker.log()[-3000:]
        finally:
            for worker in [*first, late]:
                worker.stop()
    records = check_exactly_once(settings, run_id, prompts)
    # from joining the group (its "consuming") to its first partitions
    consuming = late.events("consuming")[0]["timestamp"]
    assigned = next(e for e in late.events("partitions assigned")
                    if e["partitions"])["timestamp"]
    received_in = (datetime.fromisoformat(assigned)
                   - datetime.fromisoformat(consuming)).total_seconds()
    assert received_in < 30, received_in
    assert any(r.instance == "late" for r in records)
    revocations = [e for worker in first for e in worker.events("partitions revoked")
                   if e["partitions"] and e["owned"]]
    assert revocations, "the late worker got partitions without anyone giving any up"
    for worker in first:
        # Incremental rebalancing: until it stopped, a revocation never took
        # all of a worker's partitions.
        for revoked in worker.events("partitions revoked")[:-1]:
            if revoked["partitions"]:
                assert revoked["owned"], f"{worker.instance} lost every partition"
    # The first two kept generating after the join (broker timestamps of
    # their committed records).
    after = {decode_completion(r.value).instance
             for r in read_all(settings.bootstrap_servers, topics.completions_topic(run_id))
             if r.timestamp / 1000 > datetime.fromisoformat(assigned).timestamp()}
    assert {"orig0", "orig1"} <= after


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
            wait_until(lambda: committed_results(settings, run_id, "w2") > 0, 60,
                       "the leaver's first results committed")
            # It hands over only when it knows others are there (its fleet view).
            wait_until(lambda: leaver.events("fleet: other workers in the group"), 120,
                       "the leaver seeing the other workers")
            signalled = time.monotonic()
            leaver.terminate()
            assert leaver.wait(60) == 0, leaver.log()[-3000:]
            stopped_in = time.monotonic() - signalled
            # Others are there: it hands its partitions over at once.
            assert [e["hand_over"] for e in leaver.events("stopping")] == [True]
            assert stopped_in < 30  # no drain: well under --drain-timeout (60 s)
            # What it reports committed is exactly what is in the topic.
            mine = consumer_progress(settings, run_id).consumers["w2"]
            in_topic = [decode_completion(r.value) for r in read_all(
                settings.bootstrap_servers, topics.completions_topic(run_id))]
            assert sum(1 for r in in_topic if r.instance == "w2") == (
                mine.completions + mine.failures) > 0
            for worker in workers[:2]:
                assert worker.wait(240) == 0, worker.log()[-3000:]
        finally:
            for worker in workers:
                worker.stop()
    check_exactly_once(settings, run_id, prompts)
    # What the leaver owned when it stopped is owned by the others after
    # that. (Not "every partition it ever had": at the start partitions pass
    # through members for a moment, and one may land in another worker's
    # first assignment and never move again.)
    stopped_at = leaver.events("stopping")[0]["timestamp"]
    changes = sorted((e for name in ("partitions assigned", "partitions revoked")
                      for e in leaver.events(name) if e["timestamp"] <= stopped_at),
                     key=lambda e: e["timestamp"])
    held = set(changes[-1]["owned"])
    taken = {p for worker in workers[:2] for e in worker.events("partitions assigned")
             if e["timestamp"] >= stopped_at for p in e["partitions"]}
    assert held and held <= taken, (held, taken)


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
    records = check_exactly_once(settings, run_id, prompts)
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
        time.sleep(6)  # a paced outage: the server is down this long
        assert worker.running()
        sim.start()
        assert worker.wait(240) == 0, worker.log()[-3000:]
    finally:
        worker.stop()
        sim.terminate()
    records = check_exactly_once(settings, run_id, prompts)
    assert not [r for r in records if isinstance(r, Failure)]
    assert worker.events("SGLang server unavailable; pausing consumption")
    assert worker.events("SGLang server healthy again; resuming")


def test_in_flight_never_exceeds_the_cap(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=4)
    # 20 rounds of the cap: the cap is met from the first round on, and
    # every round after it is another chance to exceed it.
    prompts = make_prompts(run_id, 160)
    publish(settings, spec, prompts)
    peak = 0.0
    stop = threading.Event()
    with running_simulator(PACED) as url:
        def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                m = sim_metrics(url)
                peak = max(peak, m["sglang:num_running_reqs"] + m["sglang:num_queue_reqs"])
                time.sleep(0.02)  # poll of a sampling loop

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
    check_exactly_once(settings, run_id, prompts)
    assert 6 <= peak <= 8
