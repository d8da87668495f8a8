"""Workers under Kafka-level faults, on the real broker: a kill inside an open
transaction, a duplicate --instance, a zombie woken after its partitions
moved. Exactly once is checked with kafka-python reading `read_committed`;
what an aborted transaction left in the log with `read_uncommitted`."""

from __future__ import annotations

import signal
import time

import pytest

from sglang_sim import running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    check_exactly_once,
    consumer_progress,
    create_run,
    make_prompts,
    publish,
    wait_until,
)
from tests.kafka_helpers import read_all
from tokenmill.kafka import clients, groups, topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]




def test_killed_inside_an_open_transaction(settings, run_id, tmp_path) -> None:
    """The worker dies between sending its offsets and committing (its 4th
    transaction), after the results reached the broker: they stay invisible
    to read_committed readers, and the restart redoes them, once."""
    spec = create_run(settings, run_id, partitions=3)
    prompts = make_prompts(run_id, 400)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        victim = ConsumerProcess(settings, run_id, url, "victim", tmp_path, "--concurrency",
                                 "16", kill_at="transaction.committing:4").start()
        assert victim.wait(120) == 137, victim.log()[-3000:]
        assert victim.events("fault injection: killed")
        topic = topics.completions_topic(run_id)
        visible = {r.key for r in read_all(settings.bootstrap_servers, topic)}
        in_log = {r.key for r in read_all(settings.bootstrap_servers, topic,
                                          committed_only=False)}
        hidden = in_log - visible
        assert hidden, "the killed transaction held no records"
        restarted = ConsumerProcess(settings, run_id, url, "victim", tmp_path, "--until-done",
                                    "--concurrency", "16").start()
        try:
            assert restarted.wait(180) == 0, restarted.log()[-3000:]
        finally:
            restarted.stop()
    records = check_exactly_once(settings, run_id, prompts)
    assert {r.id.encode() for r in records} >= hidden  # redone and committed once


def test_a_worker_taking_over_from_one_killed_mid_commit_waits_instead_of_exiting(
        settings, run_id, tmp_path) -> None:
    """The victim dies with its offsets sent and its transaction open. Until
    the coordinator aborts that transaction (20 s timeout), the partition's
    committed offset is unstable and cannot be read. The worker that takes
    the partition over waits for it (and says so) instead of exiting on the
    timed-out read, then finishes the run exactly once."""
    spec = create_run(settings, run_id, partitions=1)
    prompts = make_prompts(run_id, 400)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        # 2 at a time: the 10th commit comes after the heir is up and waiting.
        victim = ConsumerProcess(settings, run_id, url, "victim", tmp_path, "--concurrency",
                                 "2", "--session-timeout", "6",
                                 kill_at="transaction.committing:10").start()
        wait_until(lambda: victim.events("partitions assigned"), 120, "the victim's partition")
        heir = ConsumerProcess(settings, run_id, url, "heir", tmp_path, "--until-done",
                               "--concurrency", "16", "--session-timeout", "6").start()
        try:
            wait_until(lambda: heir.events("consuming"), 120, "the heir in the group")
            assert not heir.events("partitions assigned") or heir.events(
                "partitions assigned")[-1]["owned"] == [], "the heir took the partition early"
            assert victim.wait(180) == 137, victim.log()[-3000:]
            assert heir.wait(240) == 0, heir.log()[-3000:]
        finally:
            heir.stop()
        # the risky moment was hit: the heir's first read of the offsets was refused
        assert heir.events("committed offsets not readable yet: the partitions' last owner "
                           "may have died inside a transaction; waiting for it to be aborted")
    check_exactly_once(settings, run_id, prompts)


def test_a_duplicate_instance_ends_the_older_one_with_one_line(settings, run_id,
                                                                 tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=2)
    prompts = make_prompts(run_id, 600)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        older = ConsumerProcess(settings, run_id, url, "same", tmp_path, "--concurrency",
                                "8", "--until-done").start()
        wait_until(lambda: consumer_progress(settings, run_id).generated > 50, 60, "progress")
        newer = ConsumerProcess(settings, run_id, url, "same", tmp_path, "--concurrency",
                                "8", "--until-done").start()
        try:
            assert older.wait(60) == 1
            log = older.log()
            assert "Traceback" not in log
            errors = [line for line in log.splitlines() if line.startswith("Error:")]
            assert len(errors) == 1 and "another process took over transactional id" in errors[0]
            assert newer.wait(240) == 0, newer.log()[-3000:]
        finally:
            older.stop()
            newer.stop()
    check_exactly_once(settings, run_id, prompts)


def test_a_zombie_worker_never_commits_after_its_partitions_moved(settings, run_id,
                                                                    tmp_path) -> None:
    """Frozen past its session timeout, its partitions go to the other worker,
    which commits them; woken up, the zombie's late results never become
    visible: fenced by its stale group metadata or dropped as lost."""
    spec = create_run(settings, run_id, partitions=4)
    prompts = make_prompts(run_id, 1500)
    publish(settings, spec, prompts)
    admin = clients.admin(settings)
    group, topic = topics.generate_group(run_id), topics.prompts_topic(run_id)

    def owners() -> set[str]:
        state = groups.describe(admin, group, topic)
        return {m.client_id.split("#")[0] for m in state.members if m.partitions}

    with running_simulator(PACED) as url:
        zombie = ConsumerProcess(settings, run_id, url, "zombie", tmp_path, "--concurrency",
                                 "16", "--until-done").start()
        other = ConsumerProcess(settings, run_id, url, "other", tmp_path, "--concurrency",
                                "16", "--until-done").start()
        try:
            wait_until(lambda: owners() == {"zombie", "other"}, 60, "both own partitions")
            wait_until(lambda: consumer_progress(settings, run_id).consumers.get("zombie")
                       is not None, 60, "the zombie's first commit")
            zombie.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            frozen_at = time.monotonic()
            wait_until(lambda: owners() == {"other"}, 60, "the other owns every partition")
            committed_then = consumer_progress(settings, run_id).consumers["other"].completions
            wait_until(lambda: consumer_progress(settings, run_id).consumers["other"].completions
                       > committed_then + 50, 60, "the other commits the moved partitions")
            # past the session timeout (6 s) since its last heartbeat (every 1.2 s)
            assert time.monotonic() - frozen_at > 6 - 1.2 - 0.5
            zombie.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            assert other.wait(240) == 0, other.log()[-3000:]
            assert zombie.wait(120) == 0, zombie.log()[-3000:]
        finally:
            zombie.stop()
            other.stop()
    records = check_exactly_once(settings, run_id, prompts)
    assert zombie.events("partitions lost; their uncommitted work is dropped") or any(
        "transaction aborted" in line for line in zombie.log().splitlines())
    assert {r.instance for r in records} == {"zombie", "other"}
