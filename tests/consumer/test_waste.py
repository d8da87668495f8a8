"""Wasted generation after a rebalance is bounded by the in-flight window of
the partitions that moved (README Guarantees, 4), for the three ways
partitions move from a live worker: a worker joins, a worker hands its
partitions over (SIGTERM with others in the group), and a zombie (frozen
past its session, woken after its partitions moved).

What was thrown away is counted from outside tokenmill, by the simulator
and the completions topic (tests/consumer/waste.py). The workers run one
slot each (no fleet balancing), so partitions move only where the test
moves them; prompts are published once the group has formed, so what moved
before that had nothing in flight. They are fed a few at a time, one a
partition, staying a little ahead of the requests the simulator has seen,
and the run's last prompt only once the scenario is done: every move is
mid-run, with work on every partition (ci28: a join that came late on a
loaded machine, after a timed stream had ended, moved nothing in flight).

Each test checks that
- every prompt has exactly one committed record;
- every prompt requested again was in the in-flight window of a move of its
  partition (requested before it, not committed by then), and no more was
  thrown away than those windows held;
- that is at most `--concurrency` per partition that moved, and never more
  than the workers themselves counted as dropped (their `stopped` line's
  `wasted`, by reason);
- the partitions the scenario moved had work in flight when it began: the
  move was mid-run, and the bound bounds something.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import msgspec
import pytest

from sglang_sim import running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    Publisher,
    check_exactly_once,
    consumer_progress,
    create_run,
    make_prompts,
    sim_metrics,
    wait_until,
)
from tests.consumer.waste import MOVES, Move, assignments, logged_moves, owned, waste

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS = 6
CONCURRENCY = 8
PROMPTS = 600
# Fed one prompt a partition at a time, at most AHEAD past the requests the
# simulator has seen: each fetch brings a few records of every partition, so
# a worker has requests in flight on all its partitions, not on one at a
# time (a backlog is fetched partition by partition). AHEAD covers what
# three workers hold (8 in flight and 8 queued each) and a little more.
AHEAD = 60


class Feed(threading.Thread):
    """Publishes the run's prompts as the workers take them, short of the
    last until `release()`, then the rest."""

    def __init__(self, publisher: Publisher, url: str) -> None:
        super().__init__(daemon=True)
        self.publisher, self.url = publisher, url
        self.released = threading.Event()

    def run(self) -> None:
        publisher, last = self.publisher, len(self.publisher.prompts) - 1
        while not self.released.is_set():
            seen = int(sim_metrics(self.url).get("sglang:num_requests_total", 0))
            if publisher.out < min(seen + AHEAD, last):
                publisher.to(min(publisher.out + PARTITIONS, last), chunk=PARTITIONS)
            else:
                self.released.wait(0.05)  # the poll of this wait loop
        publisher.to(len(publisher.prompts), chunk=PARTITIONS)

    def release(self) -> None:
        self.released.set()
        self.join(120)
        assert not self.is_alive(), "the feed did not finish publishing"


class Fleet:
    """Workers on one simulator whose request log the test reads."""

    def __init__(self, settings, run_id: str, url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        self.settings, self.run_id, self.url, self.tmp_path = settings, run_id, url, tmp_path
        self.workers: dict[str, ConsumerProcess] = {}

    def start(self, name: str) -> ConsumerProcess:
        worker = ConsumerProcess(self.settings, self.run_id, self.url, name, self.tmp_path,
                                 "--until-done", "--concurrency", str(CONCURRENCY),
                                 "--no-fleet-balancing").start()
        self.workers[name] = worker
        return worker

    def owned(self, name: str) -> set[int]:
        return owned(self.workers[name])

    def busy(self, workers: int) -> bool:
        """Every one of `workers` workers has a request in flight: the
        simulator runs more than the other workers' caps together."""
        running = sim_metrics(self.url).get("sglang:num_running_reqs", 0.0)
        return running > (workers - 1) * CONCURRENCY

    def wait_busy(self, workers: int) -> float:
        """Waits until `busy(workers)`; returns a moment just before the
        count that showed it. What was in flight then may finish before the
        caller acts (stop 42's CI: the leaver's requests, 0.3 s each, done
        in the gap), so a window of work is taken from this moment to the
        act, not at the act alone."""
        checked = [0.0]

        def busy() -> bool:
            checked[0] = time.time()
            return self.busy(workers)

        wait_until(busy, 60, f"{workers} workers each with a request in flight")
        return checked[0]

    def formed(self) -> bool:
        """The group has settled: every worker owns its equal share, and
        together all the partitions (the assignor moves nothing more)."""
        shares = [self.owned(name) for name in self.workers]
        return (all(len(share) == PARTITIONS // len(shares) for share in shares)
                and set().union(*shares) == set(range(PARTITIONS)))

    def reported_waste(self) -> int:
        """What the workers counted as dropped (their last `stopped` lines)."""
        return sum(n for worker in self.workers.values()
                   for n in worker.events("stopped")[-1]["wasted"].values())

    def finish(self, timeout_s: float = 240) -> None:
        for worker in self.workers.values():
            assert worker.wait(timeout_s) == 0, worker.log()[-3000:]

    def stop(self) -> None:
        for worker in self.workers.values():
            if worker.proc is not None and worker.running():
                worker.proc.send_signal(signal.SIGCONT)  # a zombie left frozen by a failure
            worker.stop()


def _run(settings, run_id: str, tmp_path: Path, workers: list[str],  # type: ignore[no-untyped-def]
         scenario) -> tuple[list[Move], list[set[str]], list[set[str]]]:
    """Starts `workers`, feeds them once their group has formed, runs
    `scenario(fleet)` mid-run, lets the run end and checks the waste
    against the in-flight windows of the partitions that moved. Returns
    the moves, their windows, and what each moved partition had requested
    and not committed when the scenario began (`scenario` returns when it
    saw the work and when it acted, if it waits for work: the window is then
    what was in flight at some moment between the two; else it is the call).
    A graceful hand-over drains and commits before it revokes, so its window
    at the move is rightly empty (ci33); the work it had when the scenario
    began shows the move was mid-run."""
    spec = create_run(settings, run_id, partitions=PARTITIONS)
    prompts = make_prompts(run_id, PROMPTS)
    request_log = tmp_path / "requests.jsonl"
    with running_simulator(msgspec.structs.replace(PACED, request_log=str(request_log))) as url:
        fleet = Fleet(settings, run_id, url, tmp_path)
        try:
            for name in workers:
                fleet.start(name)
            wait_until(fleet.formed, 120, "the workers sharing every partition")
            published_at = time.time()
            feed = Feed(Publisher(settings, spec, prompts), url)
            feed.start()
            wait_until(lambda: consumer_progress(settings, run_id).generated >= PROMPTS // 4,
                       120, "a quarter of the run generated")
            before = time.time()
            checked, acted = scenario(fleet) or (before, before)  # its own moments, if any
            feed.release()
            fleet.finish()
        finally:
            fleet.stop()
    check_exactly_once(settings, run_id, prompts)
    moves = logged_moves(fleet.workers, published_at)
    found = waste(settings, run_id, prompts, PARTITIONS, request_log, moves,
                  assignments(fleet.workers, published_at))
    reported = fleet.reported_waste()
    print(f"wasted {found.wasted} requests ({len(found.redone)} prompts); moves {moves}; "
          f"windows {[len(w) for w in found.windows]}; the workers counted {reported}")
    found.check()
    assert found.wasted <= CONCURRENCY * len(moves), (found.wasted, moves)
    assert found.wasted <= reported, (found.wasted, reported)
    at_start = found.windows_at([(name, p, acted) for name, p, _ in moves], since=checked)
    return moves, found.windows, at_start


def test_waste_after_a_join_is_bounded_by_the_moved_partitions_window(settings, run_id,
                                                                      tmp_path) -> None:
    def join(fleet: Fleet) -> None:
        fleet.start("late")
        wait_until(lambda: fleet.owned("late"), 60, "partitions for the late worker")

    moves, windows, at_start = _run(settings, run_id, tmp_path, ["w0", "w1"], join)
    given = [w for (name, _, _), w in zip(moves, at_start) if name in ("w0", "w1")]
    assert given, f"the join moved nothing: {moves}"
    # the partitions that moved had work in flight as the join began (mid-run)
    assert any(given), (moves, windows, at_start)


def test_waste_after_a_hand_over_is_bounded_by_the_moved_partitions_window(settings, run_id,
                                                                           tmp_path) -> None:
    def hand_over(fleet: Fleet) -> tuple[float, float]:
        leaver = fleet.workers["w2"]
        wait_until(lambda: leaver.events("fleet: other workers in the group"), 60,
                   "the leaver seeing the other workers")
        # the leaver has requests in flight as it is told to go (ci38: a
        # feed that fell behind on a loaded machine left a worker idle)
        checked = fleet.wait_busy(3)
        told = time.time()
        leaver.terminate()
        assert leaver.wait(60) == 0, leaver.log()[-3000:]
        assert [e["hand_over"] for e in leaver.events("stopping")] == [True]
        return checked, told

    moves, windows, at_start = _run(settings, run_id, tmp_path, ["w0", "w1", "w2"], hand_over)
    assert {name for name, _, _ in moves} == {"w2"}, moves
    # the leaver had work in flight on them when it was told to go (mid-run)
    assert any(at_start), (moves, windows, at_start)


def test_waste_after_a_zombie_wakes_is_bounded_by_the_moved_partitions_window(settings, run_id,
                                                                              tmp_path) -> None:
    def zombie(fleet: Fleet) -> tuple[float, float]:
        frozen = fleet.workers["w1"]
        assert frozen.proc is not None
        # it freezes with requests in flight (ci38: on a loaded machine the
        # feed fell behind and it froze idle, with nothing to hold)
        checked = fleet.wait_busy(2)
        frozen.proc.send_signal(signal.SIGSTOP)
        froze = time.time()
        try:
            # past its session (6 s): the other worker takes its partitions
            wait_until(lambda: fleet.owned("w0") == set(range(PARTITIONS)), 60,
                       "w0 owning the frozen worker's partitions")
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: frozen.events(MOVES[1]), 60, "the zombie learning it lost them")
        return checked, froze

    moves, windows, at_start = _run(settings, run_id, tmp_path, ["w0", "w1"], zombie)
    assert "w1" in {name for name, _, _ in moves}, moves
    # the zombie had work in flight on them when it froze (mid-run); at its
    # wake-up the new owner may have committed it all already (ci34)
    assert any(w for (name, _, _), w in zip(moves, at_start) if name == "w1"), (
        moves, windows, at_start)
