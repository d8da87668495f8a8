"""Workers under Kafka-level faults, on the real broker: a kill inside an open
transaction, a duplicate --instance, a zombie woken after its partitions
moved. Exactly once is checked with kafka-python reading `read_committed`;
what an aborted transaction left in the log with `read_uncommitted`."""

from __future__ import annotations

import re
import signal

import pytest

from sglang_sim import running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    check_exactly_once,
    committed_results,
    consumer_progress,
    create_run,
    event_time,
    make_prompts,
    publish,
    sim_metrics,
    wait_until,
)
from tests.consumer.waste import owned
from tests.gate import Gate
from tests.kafka_helpers import read_all
from tests.rebalance import STALE_MEMBER, Group
from tokenmill.kafka import topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]

LOST = "partitions lost; their uncommitted work is dropped"


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


VICTIM_TRANSACTION_S = 12  # the default 20 s would read after 20 s or more


def test_a_worker_taking_over_from_one_killed_mid_commit_waits_instead_of_exiting(
        settings, run_id, tmp_path) -> None:
    """The victim dies with its offsets sent and its transaction open. Until
    the coordinator aborts that transaction (the victim's
    --transaction-timeout, 12 s here), the partition's committed offset is
    unstable and cannot be read. The worker that takes the partition over
    waits for it (and says so) instead of exiting on the timed-out read,
    then finishes the run exactly once."""
    spec = create_run(settings, run_id, partitions=1)
    prompts = make_prompts(run_id, 400)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        # 2 at a time: the 10th commit comes after the heir is up and waiting.
        victim = ConsumerProcess(settings, run_id, url, "victim", tmp_path, "--concurrency",
                                 "2", "--session-timeout", "6", "--transaction-timeout",
                                 str(VICTIM_TRANSACTION_S),
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
        # aborted at the victim's timeout, not the default 20 s: the heir read the offsets
        # about 12 s after the kill (the coordinator looks every second)
        (killed,) = victim.events("fault injection: killed")
        read = heir.events("committed offsets read after waiting")[0]
        assert event_time(read) - event_time(killed) < VICTIM_TRANSACTION_S + 5, (killed, read)
    check_exactly_once(settings, run_id, prompts)


def test_a_duplicate_instance_ends_the_older_one_with_one_line(settings, run_id,
                                                                 tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=2)
    prompts = make_prompts(run_id, 300)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as upstream, Gate(upstream) as gate:
        # the last prompt of each partition: the run goes on until the older one ended,
        # so the newer one takes over mid-run however slowly it starts (an older one
        # left with nothing else to do is fenced at its next heartbeat commit)
        finish = gate.hold(containing=[f"Question {p.seq}:" for p in prompts[-2:]])
        older = ConsumerProcess(settings, run_id, gate.url("older"), "same", tmp_path,
                                "--concurrency", "8", "--until-done").start()
        wait_until(lambda: consumer_progress(settings, run_id).generated > 50, 60, "progress")
        newer = ConsumerProcess(settings, run_id, gate.url("newer"), "same", tmp_path,
                                "--concurrency", "8", "--until-done").start()
        try:
            assert older.wait(60) == 1
            finish.release()
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
    which commits them. While it is frozen, the answers to its requests in
    flight reach it; woken up, it holds results it can no longer commit: its
    late commit is refused (its group membership is stale) or its partitions
    are declared lost, and none of those results ever becomes visible."""
    spec = create_run(settings, run_id, partitions=4)
    prompts = make_prompts(run_id, 600)
    publish(settings, spec, prompts)
    group = Group(settings, topics.generate_group(run_id), topics.prompts_topic(run_id), 4)

    def owners(members) -> set[str]:  # type: ignore[no-untyped-def]
        return {m.client_id.split("#")[0] for m in members if m.owned}

    with running_simulator(PACED) as upstream, Gate(upstream) as gate:
        # the last prompt of every partition: the run goes on until the zombie woke
        finish = gate.hold(containing=[f"Question {p.seq}:" for p in prompts[-4:]])
        # the other's requests wait until the zombie committed once: the run
        # is not the other's alone while the zombie starts (a loaded machine)
        other_first = gate.hold(callers={"other"})
        zombie = ConsumerProcess(settings, run_id, gate.url("zombie"), "zombie", tmp_path,
                                 "--concurrency", "16", "--until-done").start()
        other = ConsumerProcess(settings, run_id, gate.url("other"), "other", tmp_path,
                                "--concurrency", "16", "--until-done").start()
        try:
            group.wait(lambda ms: owners(ms) == {"zombie", "other"}, 60, "both own partitions")
            wait_until(lambda: committed_results(settings, run_id, "zombie") > 0, 60,
                       "the zombie's first results committed")
            other_first.release()
            in_flight = gate.hold(callers={"zombie"})  # its next requests wait in the gate
            gate.wait(lambda: in_flight.held, 60, "the zombie's requests in flight")
            zombie.signal(signal.SIGSTOP)
            group.wait(lambda ms: owners(ms) == {"other"}, 60, "the other owns every partition")
            committed_then = consumer_progress(settings, run_id).consumers["other"].completions
            wait_until(lambda: consumer_progress(settings, run_id).consumers["other"].completions
                       > committed_then + 50, 60, "the other commits the moved partitions")
            # The answers to the frozen zombie's requests reach it (its socket buffers).
            answered = gate.count("zombie").answered
            in_flight.release()
            # (all but those of the last prompts, which `finish` holds on)
            gate.wait(lambda: not in_flight.held and gate.count("zombie").pending
                      == gate.count("zombie").held, 60,
                      "the zombie's requests answered while it is frozen")
            late = gate.count("zombie").answered - answered
            mark = zombie.mark()
            zombie.signal(signal.SIGCONT)
            refused = gate.wait(lambda: [e for e in zombie.events("transaction aborted", mark)
                                         if re.search(STALE_MEMBER, e["cause"])]
                                or zombie.events(LOST, mark), 120,
                                "the zombie's late commit refused, or its partitions lost")
            finish.release()
            assert other.wait(240) == 0, other.log()[-3000:]
            assert zombie.wait(120) == 0, zombie.log()[-3000:]
            served = sim_metrics(upstream)["sglang:num_requests_total"]
        finally:
            zombie.stop()
            other.stop()
    records = check_exactly_once(settings, run_id, prompts)
    assert {r.instance for r in records} == {"zombie", "other"}
    # What it held was thrown away, never committed: the server answered
    # at least that many requests more than there are records.
    assert late >= 1 and served - len(records) >= late, (served, len(records), late)
    if not any(e.get("cause") for e in refused):  # lost, then: counted as wasted
        assert zombie.events("stopped", mark)[-1]["wasted"].get("lost", 0) > 0


def test_a_worker_given_partitions_as_it_closes_leaves_without_waiting(settings, run_id,
                                                                       tmp_path) -> None:
    """b stops and is held just before its slot's consumer closes (crash
    point group.closing) while a leaves: the group moves a's partition to
    b, which is handed it inside close(). It will read nothing from it, so
    it leaves at once, instead of waiting for committed offsets its closing
    consumer cannot read (45 s, then an error; the sinks' twin is in
    tests/sink/test_rebalance.py)."""
    create_run(settings, run_id, partitions=2)
    release = tmp_path / "release"
    args = ("--no-fleet-balancing", "--concurrency", "2")
    group = Group(settings, topics.generate_group(run_id), topics.prompts_topic(run_id), 2)
    with running_simulator(PACED) as url:
        a = ConsumerProcess(settings, run_id, url, "a", tmp_path, *args).start()
        b = ConsumerProcess(settings, run_id, url, "b", tmp_path, *args, faults=(
            "--hold-at", "group.closing", "--hold-until", str(release))).start()
        try:
            wait_until(lambda: owned(a) and owned(b), 60, "each owning one")
            moved = owned(a)
            b.terminate()
            wait_until(lambda: b.events("fault injection: holding"), 60,
                       "b held before its consumer closes")
            a.terminate()
            assert a.wait(60) == 0, a.log()[-3000:]
            group.wait(lambda ms: [m.target for m in ms] == [frozenset({0, 1})], 30,
                       "a's partition moved to b, in the group's eyes")
            release.touch()
            assert b.wait(30) == 0, b.log()[-3000:]
        finally:
            a.stop()
            b.stop()
    given = b.events("partitions given while closing: left unread")
    assert given and set(given[0]["partitions"]) == moved, b.log()[-3000:]
