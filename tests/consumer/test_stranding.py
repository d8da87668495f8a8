"""No partition is ever stranded: a newcomer joins, an existing member is
SIGKILLed at one of ten moments spread over the rebalance (0.2 s to 10 s
after the join), then restarted with the same --instance. Each time, every
partition is owned again by a live member within the session timeout + 15 s,
and the run finishes exactly once. For workers and for sinks, on the real
broker (KIP-848, dynamic members: a dead member's partitions wait for its
session to expire, never longer)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import (
    ConsumerProcess,
    committed_records,
    create_run,
    duplicates,
    make_prompts,
    publish,
    wait_until,
)
from tests.sink.sink_helpers import (
    assert_exactly_once,
    feed,
    make_spec,
    publish_done,
    start_sink,
    variant,
)
from tests.sink.sink_helpers import (
    create_run as create_sink_run,
)
from tokenmill.kafka import clients, groups, topics

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]

SESSION_S = 6.0
MOMENTS_S = [0.2, 0.5, 1.0, 1.5, 2.2, 3.0, 4.0, 5.5, 7.5, 10.0]
# Slow enough that the run outlasts the ten kills: ~1-2 s per request.
SLOW = SimulatorConfig(decode_rate=60.0, length_median=80, length_sigma=0.3, length_max=200,
                       max_running_requests=256, prefill_rate=0)


def _members(settings, group: str, topic: str) -> groups.GroupState:
    return groups.describe(clients.admin(settings), group, topic)


def _owned_by_live(settings, group: str, topic: str, partitions: int,
                   dead_members: set[str]) -> bool:
    """Every partition owned by a member that is not one of the killed
    incarnation's (member ids, not client ids: the restart reuses those)."""
    admin = clients.admin(settings)
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    owned = {tp.partition for m in described.members if m.member_id not in dead_members
             for tp in m.assignment.topic_partitions if tp.topic == topic}
    return owned == set(range(partitions))


def _member_ids(settings, group: str, prefix: str) -> set[str]:
    admin = clients.admin(settings)
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    return {m.member_id for m in described.members if (m.client_id or "").startswith(prefix)}


def _kill_cycles(settings, group: str, topic: str, partitions: int, *,
                 start_newcomer: Callable[[int], object], stop_newcomer: Callable[[object], None],
                 kill_victim: Callable[[], None], restart_victim: Callable[[], None],
                 victim_prefix: str) -> list[float]:
    """Ten join-then-kill cycles; returns how long each took to heal."""
    healed = []
    for i, moment in enumerate(MOMENTS_S):
        newcomer = start_newcomer(i)
        time.sleep(moment)  # the kill lands at a chosen point of the rebalance
        dead = _member_ids(settings, group, victim_prefix)
        kill_victim()
        killed_at = time.monotonic()
        restart_victim()
        wait_until(lambda: _owned_by_live(settings, group, topic, partitions, dead),
                   SESSION_S + 15, f"every partition owned again (kill {i} at {moment}s)")
        healed.append(time.monotonic() - killed_at)
        stop_newcomer(newcomer)
    return healed


def test_workers_are_never_stranded(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=8)
    prompts = make_prompts(run_id, 6000)
    publish(settings, spec, prompts)
    group, topic = topics.generate_group(run_id), topics.prompts_topic(run_id)
    with running_simulator(SLOW) as url:
        steady = ConsumerProcess(settings, run_id, url, "steady", tmp_path, "--concurrency",
                                 "24", "--until-done").start()
        victim = ConsumerProcess(settings, run_id, url, "victim", tmp_path, "--concurrency",
                                 "24", "--until-done").start()
        wait_until(lambda: _owned_by_live(settings, group, topic, 8, set()), 60, "first owners")

        def start_newcomer(i: int) -> ConsumerProcess:
            return ConsumerProcess(settings, run_id, url, f"new{i}", tmp_path,
                                   "--concurrency", "24").start()

        try:
            healed = _kill_cycles(
                settings, group, topic, 8, start_newcomer=start_newcomer,
                stop_newcomer=lambda p: p.stop(),  # type: ignore[attr-defined]
                kill_victim=victim.kill, restart_victim=victim.start, victim_prefix="victim#")
            assert max(healed) <= SESSION_S + 15
            assert steady.wait(600) == 0, steady.log()[-3000:]
            assert victim.wait(120) == 0, victim.log()[-3000:]
        finally:
            steady.stop()
            victim.stop()
    records = committed_records(settings, run_id)
    assert duplicates(records) == {}
    assert {r.id for r in records} == {p.id for p in prompts}
    print(f"healed in {[round(h, 1) for h in healed]} s")


def test_sinks_are_never_stranded(settings, run_id, tmp_path) -> None:
    spec = make_spec(run_id, partitions=6)
    create_sink_run(settings, spec)
    records = [variant(spec, i, "good") for i in range(600)]
    group, topic = topics.sink_group(run_id), topics.completions_topic(run_id)
    args = ("--batch-size", "20", "--max-batch-age", "1", "--session-timeout", str(SESSION_S),
            "--create-bucket", "--until-done")
    logs = tmp_path
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str) -> subprocess.Popen[bytes]:
        procs[name] = start_sink(settings, run_id, *args, "--instance", name,
                                 log_path=logs / f"{name}.log")
        return procs[name]

    start("steady")
    start("victim")
    wait_until(lambda: _owned_by_live(settings, group, topic, 6, set()), 60, "first owners")

    def feeder_step(i: int) -> subprocess.Popen[bytes]:
        # records keep arriving while the group moves
        feed(settings, spec, records[i * 60:(i + 1) * 60], per_transaction=20,
             with_aborted=False)
        return start(f"new{i}")

    def stop(proc: object) -> None:
        assert isinstance(proc, subprocess.Popen)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    def kill_victim() -> None:
        procs["victim"].kill()
        procs["victim"].wait(10)

    try:
        healed = _kill_cycles(settings, group, topic, 6, start_newcomer=feeder_step,
                              stop_newcomer=stop, kill_victim=kill_victim,
                              restart_victim=lambda: start("victim"), victim_prefix="victim#")
        publish_done(settings, run_id, len(records))
        assert procs["steady"].wait(120) == 0, (logs / "steady.log").read_text()[-3000:]
        assert procs["victim"].wait(120) == 0, (logs / "victim.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    assert max(healed) <= SESSION_S + 15
    assert_exactly_once(settings, run_id, {r.id for r in records})
