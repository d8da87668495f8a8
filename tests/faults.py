"""A test entry point that runs a tokenmill command with a crash injected at
a crash point (tokenmill/crashpoints.py): the services carry no fault switch.

    python -m tests.faults --kill-at transaction.committing:3 -- consume --run r ...
    python -m tests.faults --kill-at export.shard_written:2 -- export RUN ...

kills the process (exit 137, as after kill -9) the 3rd time it reaches that
point, after pushing out what it buffered (a transaction's records reach the
broker uncommitted, so they really must never become visible). The line
`fault injection: killed` in the log proves the moment was hit.

Beside the services' own crash points, the group's rebalance callbacks are
points too: `rebalance.revoke`, `rebalance.assign`, `rebalance.lost`,
reached as the consumer's callback begins (with partitions).

Narrowing the moment (each optional):

    --armed-by PATH   count only what happens once PATH exists (the test
                      creates it when the moment it waits for has come)
    --inside CALLBACK count only points reached inside that rebalance
                      callback (`revoke`: e.g. the commit a revoke makes)
    --refuse-outside  once armed, refuse (abort at its start) every
                      transaction begun outside CALLBACK: its results stay
                      uncommitted for the transaction inside CALLBACK to carry
    --report-at POINT log `fault injection: reached` at POINT (no kill;
                      may be given more than once)
    --hold-at POINT --hold-until PATH
                      at POINT (armed), log `fault injection: holding` and
                      wait there until PATH exists (at most 120 s): e.g. a
                      member about to close while the group moves partitions

Or, instead of a kill, the consumer stops fetching as librdkafka was seen
to after a broker restart (tokenmill/kafka/fetch_stall.py):

    --stop-fetching-at POINT[:N]   pause every partition the process's
                      consumers hold, behind the service's back (nothing
                      tells it), the Nth time POINT is reached; logged as
                      `fault injection: fetching stopped`
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from tokenmill import crashpoints
from tokenmill.kafka import clients

KILLED_EXIT_CODE = 137
HOLD_S = 120.0
CALLBACKS = ("assign", "revoke", "lost")


class Refused(RuntimeError):
    """Raised at a transaction's start to refuse it."""


def _event(name: str, **fields: object) -> None:
    """A JSON line with structlog's timestamp format, beside the service's own."""
    stamp = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    print(json.dumps({"event": name, **fields, "timestamp": stamp}), file=sys.stderr, flush=True)


class _Callbacks(threading.local):
    def __init__(self) -> None:
        self.active: list[str] = []


_in_callback = _Callbacks()


class ObservedConsumer(Consumer):
    """A consumer whose rebalance callbacks are crash points, and known to
    be running (for `--inside`)."""

    made: list[ObservedConsumer] = []  # every one this process made (--stop-fetching-at)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        ObservedConsumer.made.append(self)

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:  # type: ignore[override]
        for kind in CALLBACKS:
            given = callbacks.get(f"on_{kind}")
            if given is not None:
                callbacks[f"on_{kind}"] = _observed(kind, given)
        super().subscribe(topics, **callbacks)


def _observed(kind: str, callback: Callable[[Any, list[Any]], None]
              ) -> Callable[[Any, list[Any]], None]:
    count = 0

    def run(consumer: Any, partitions: list[Any]) -> None:
        nonlocal count
        if partitions:
            count += 1
            crashpoints.reached(f"rebalance.{kind}", count)
        _in_callback.active.append(kind)
        try:
            callback(consumer, partitions)
        finally:
            _in_callback.active.pop()

    return run


class KillAt(crashpoints.Observer):
    def __init__(self, point: str | None, count: int, *, armed_by: Path | None = None,
                 inside: str | None = None, refuse_outside: bool = False,
                 report_at: tuple[str, ...] = (),
                 stop_fetching_at: tuple[str, int] | None = None,
                 hold_at: str | None = None, hold_until: Path | None = None) -> None:
        self.point = point
        self.count = count
        self.armed_by = armed_by
        self.inside = inside
        self.refuse_outside = refuse_outside
        self.report_at = report_at
        self.stop_fetching_at = stop_fetching_at
        self.hold_at = hold_at
        self.hold_until = hold_until
        self.seen = 0  # times `point` was reached armed and inside CALLBACK

    def armed(self) -> bool:
        return self.armed_by is None or self.armed_by.exists()

    def reached(self, point: str, count: int, flush: Callable[[], object] | None) -> None:
        if point in self.report_at:
            _event("fault injection: reached", point=point, count=count)
        if self.stop_fetching_at == (point, count):
            _stop_fetching(point, count)
        if not self.armed():
            return
        if point == self.hold_at and self.hold_until is not None:
            _hold(point, count, self.hold_until)
        inside = self.inside is None or self.inside in _in_callback.active
        if self.refuse_outside and point == "transaction.begin" and not inside:
            _event("fault injection: refused", point=point, count=count)
            raise Refused("fault injection: transaction refused")
        if point != self.point or not inside:
            return
        self.seen += 1
        # Narrowed, the Nth time here armed and inside; else (as always) the
        # Nth time the process reached the point (a transaction's number).
        narrowed = self.armed_by is not None or self.inside is not None
        if (self.seen if narrowed else count) != self.count:
            return
        if flush is not None:
            flush()
        _event("fault injection: killed", point=point, count=count, inside=self.inside)
        os._exit(KILLED_EXIT_CODE)


def _hold(point: str, count: int, until: Path) -> None:
    _event("fault injection: holding", point=point, count=count)
    deadline = time.monotonic() + HOLD_S
    while not until.exists():
        if time.monotonic() > deadline:
            _event("fault injection: never released", point=point, count=count)
            os._exit(KILLED_EXIT_CODE)
        time.sleep(0.05)  # the poll of this wait loop
    _event("fault injection: released", point=point, count=count)


def _stop_fetching(point: str, count: int) -> None:
    paused = []
    for consumer in ObservedConsumer.made:
        try:
            held = consumer.assignment()
        except RuntimeError:  # closed (a one-off read's consumer)
            continue
        consumer.pause(held)
        paused += [tp.partition for tp in held]
    _event("fault injection: fetching stopped", point=point, count=count,
           partitions=sorted(paused))


def assert_fetch_stall_exit(text: str, stall_s: float, most_s: float) -> None:
    """The log of a service whose fetching was stopped: it exited with one
    `Error:` line naming the stall and what waits, after a silence of at
    least `stall_s` and at most `most_s` (the looks come every half limit:
    a fixed 10 s between them made a worker's 5 s limit 19 s), and was never
    told (no revocation or loss after the stop)."""
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "stopped fetching" in errors[0], text[-3000:]
    assert "records from offset" in errors[0]
    assert "Traceback" not in text
    silent = re.search(r"nothing came for (\d+)s", errors[0])
    assert silent is not None and stall_s <= int(silent.group(1)) <= most_s, errors[0]
    after = text[text.index("fault injection: fetching stopped"):]
    assert "partitions revoked" not in after and "partitions lost" not in after


def _point(spec: str) -> tuple[str, int]:
    point, _, count = spec.partition(":")
    return point, int(count or 1)


def parse(spec: str, **options: Any) -> KillAt:
    point, _, count = spec.partition(":")
    return KillAt(point or None, int(count or 1), **options)


def main(argv: list[str]) -> None:
    if "--" not in argv:
        raise SystemExit("usage: python -m tests.faults [--kill-at POINT[:N]] [options] "
                         "-- COMMAND ARGS...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--kill-at", default="")
    parser.add_argument("--armed-by", type=Path)
    parser.add_argument("--inside", choices=CALLBACKS)
    parser.add_argument("--refuse-outside", action="store_true")
    parser.add_argument("--report-at", action="append", default=[])
    parser.add_argument("--stop-fetching-at", type=_point)
    parser.add_argument("--hold-at")
    parser.add_argument("--hold-until", type=Path)
    options = parser.parse_args(argv[:split])
    crashpoints.install(parse(options.kill_at, armed_by=options.armed_by, inside=options.inside,
                              refuse_outside=options.refuse_outside,
                              report_at=tuple(options.report_at),
                              stop_fetching_at=options.stop_fetching_at,
                              hold_at=options.hold_at, hold_until=options.hold_until))
    clients.Consumer = ObservedConsumer  # type: ignore[misc]
    from tokenmill.cli import main as tokenmill

    tokenmill(argv[split + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
