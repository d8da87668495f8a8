"""A test entry point that runs a tokenmill command with a crash injected at
a crash point (tokenmill/crashpoints.py): the services carry no fault switch.

    python -m tests.faults --kill-at transaction.committing:3 -- consume --run r ...
    python -m tests.faults --kill-at export.shard_written:2 -- export RUN ...

kills the process (exit 137, as after kill -9) the 3rd time it reaches that
point, after pushing out what it buffered (a transaction's records reach the
broker uncommitted, so they really must never become visible). The line
`fault injection: killed` in the log proves the moment was hit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tokenmill import crashpoints

KILLED_EXIT_CODE = 137


class KillAt(crashpoints.Observer):
    def __init__(self, point: str, count: int) -> None:
        self.point = point
        self.count = count

    def reached(self, point: str, count: int, flush: Callable[[], object] | None) -> None:
        if point != self.point or count != self.count:
            return
        if flush is not None:
            flush()
        print(f'{{"event": "fault injection: killed", "point": "{point}", "count": {count}}}',
              file=sys.stderr, flush=True)
        os._exit(KILLED_EXIT_CODE)


def parse(spec: str) -> KillAt:
    point, _, count = spec.partition(":")
    return KillAt(point, int(count or 1))


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] != "--kill-at" or "--" not in argv:
        raise SystemExit("usage: python -m tests.faults --kill-at POINT[:N] -- COMMAND ARGS...")
    crashpoints.install(parse(argv[1]))
    from tokenmill.cli import main as tokenmill

    tokenmill(argv[argv.index("--") + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
