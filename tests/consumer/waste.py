"""Wasted generation, counted from outside tokenmill (README Guarantees, 4:
bounded by the in-flight window of the partitions that moved).

The simulator's request log has one line per request it received, named by
the prompt's id, with its arrival time; the completions topic has each
prompt's committed record, with the time it was produced into its
transaction. A *move* is a partition leaving a worker at a moment: a
revoke or loss in the worker's log, or the worker killed. Its *window* is
what the worker had of that partition then: the prompts requested before
the move and not committed by then (in flight, or finished and waiting for
a commit). Every request beyond a prompt's first was thrown away; each must
be a prompt in the window of a move of its partition.

The simulator stamps a request when its handler runs, which under load is
after the sender sent it, even after the sender logged a move (a CI run of
2026-12-06: a worker's requests sent before its revoke, stamped 18 ms after
its log line). So a move's window takes the prompts first stamped before
the partition's next assignment, not before the move: until then no other
worker could ask for them, so what was stamped was sent by the worker that
moved. Not when another worker was given the partition before the move was
logged (a zombie logs its loss on waking, after the new owner began): then
the window ends at the move."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from schemas import PromptRecord
from tests.consumer.pipeline import ConsumerProcess, event_time
from tests.kafka_helpers import read_all
from tokenmill.kafka import topics

MOVES = ("partitions revoked", "partitions lost; their uncommitted work is dropped")

Move = tuple[str, int, float]  # worker, partition, when (time.time())


def owned(worker: ConsumerProcess, since: int = 0) -> set[int]:
    """The partitions `worker` owned after its last assignment change (in its
    log after `since`, a `mark()`)."""
    changes = [e for event in ("partitions assigned", *MOVES)
               for e in worker.events(event, since) if "owned" in e]
    changes.sort(key=event_time)
    return set(changes[-1]["owned"]) if changes else set()


def stamped_by(url: str) -> float:
    """A time by which the simulator at `url` has stamped every request sent
    to it before this call: one of its own requests, answered. It stamps a
    request when its handler runs, which under load comes after the sender
    sent it, even after the sender was killed; a kill's move is at this time."""
    with urllib.request.urlopen(f"{url}/health", timeout=30) as answer:
        answer.read()
    return time.time()


def logged_moves(workers: dict[str, ConsumerProcess], since: float) -> list[Move]:
    """Every partition a worker gave up or lost after `since` (its log)."""
    return [(name, p, event_time(e)) for name, worker in workers.items()
            for event in MOVES for e in worker.events(event) if event_time(e) >= since
            for p in e["partitions"]]


def assignments(workers: dict[str, ConsumerProcess], since: float) -> list[Move]:
    """Every partition given to a worker after `since` (its log), as
    (worker, partition, when)."""
    return [(name, p, event_time(e)) for name, worker in workers.items()
            for e in worker.events("partitions assigned") if event_time(e) >= since
            for p in e["partitions"]]


def requests_by_prompt(request_log: Path) -> dict[str, list[float]]:
    """When the simulator received each request, per prompt id (a retry's
    rid carries the attempt after a dot)."""
    out: dict[str, list[float]] = defaultdict(list)
    for line in request_log.read_text().splitlines():
        entry = json.loads(line)
        out[entry["rid"].split(".")[0]].append(entry["at"])
    return out


@dataclass
class Waste:
    wasted: int  # requests beyond each prompt's first
    redone: set[str]  # prompts requested more than once
    windows: list[set[str]]  # one per move
    requested: dict[str, list[float]]  # when each prompt was requested
    committed: dict[str, float]  # when each prompt's record was produced
    partition: dict[str, int]  # each prompt's partition
    assigned: list[Move]  # (worker, partition, when) each partition was given to a worker

    def check(self) -> None:
        """Every redone prompt was in the window of a move of its partition,
        and no more was thrown away than those windows held."""
        covered = set().union(*self.windows)
        assert self.redone <= covered, sorted(self.redone - covered)[:10]
        assert self.wasted <= sum(len(w) for w in self.windows), (
            self.wasted, [len(w) for w in self.windows])

    def sent_by(self, move: Move) -> float:
        """A moment by which the simulator has stamped every request the
        mover sent for the partition, and no other worker's: the
        partition's next assignment (never: inf), or the move itself when
        another worker was given the partition since the mover was."""
        mover, partition, at = move
        given = [(name, when) for name, p, when in self.assigned if p == partition]
        mover_got = max((when for name, when in given if name == mover and when <= at),
                        default=float("-inf"))
        if any(name != mover and mover_got < when <= at for name, when in given):
            return at
        return min((when for _, when in given if when > at), default=float("inf"))

    def in_flight(self, partition: int, requested_by: float, open_at: float) -> set[str]:
        """The partition's prompts first requested by `requested_by` and not
        committed at `open_at`."""
        return {x for x, times in self.requested.items() if self.partition[x] == partition
                and min(times) <= requested_by and self.committed[x] > open_at}

    def windows_of(self, moves: list[Move]) -> list[set[str]]:
        """Each move's window: its partition's prompts first stamped by
        `sent_by(move)` and not committed at the move."""
        return [self.in_flight(move[1], self.sent_by(move), move[2]) for move in moves]

    def windows_at(self, moves: list[Move], since: float) -> list[set[str]]:
        """What each move's partition had in flight at some moment from
        `since` to the move's (requested by the move, committed after `since`)."""
        return [self.in_flight(p, when, since) for _, p, when in moves]

def waste(settings, run_id: str, prompts: list[PromptRecord], partitions: int,  # type: ignore[no-untyped-def]
          request_log: Path, moves: list[Move], assigned: list[Move]) -> Waste:
    """The run's waste and the windows of `moves` (every prompt committed);
    `assigned`: the partitions given to workers since the first move."""
    requested = requests_by_prompt(request_log)
    assert set(requested) == {p.id for p in prompts}
    committed = {r.key.decode(): r.timestamp / 1000 for r in read_all(
        settings.bootstrap_servers, topics.completions_topic(run_id), timeout_s=60)}
    found = Waste(wasted=sum(len(times) - 1 for times in requested.values()),
                  redone={x for x, times in requested.items() if len(times) > 1},
                  windows=[], requested=requested, committed=committed,
                  partition={p.id: p.seq % partitions for p in prompts}, assigned=assigned)
    found.windows = found.windows_of(moves)
    return found
