"""A test entry point that runs a tokenmill command with a crash injected at
a transaction step: the services themselves carry no fault switch.

    python -m tests.faults --kill-at committing:3 -- consume --run r ...

kills the process (exit 137, as after kill -9) when the 3rd transaction of
its transactional producer reaches that step, after pushing what it produced
to the broker, so the open transaction really holds records that must never
become visible. The line `fault injection: killed` in the log proves the
moment was hit.
"""

from __future__ import annotations

import os
import sys

from tokenmill.transactions import Step, TransactionHooks, install_hooks

KILLED_EXIT_CODE = 137


class KillAt(TransactionHooks):
    def __init__(self, step: str, transaction: int) -> None:
        self.at = step
        self.transaction = transaction

    def step(self, name: Step, transaction: int, producer: object) -> None:
        if name != self.at or transaction != self.transaction:
            return
        flush = getattr(producer, "flush", None)
        if flush is not None:
            flush(30)  # the records reach the broker, uncommitted
        print(f'{{"event": "fault injection: killed", "step": "{name}", '
              f'"transaction": {transaction}}}', file=sys.stderr, flush=True)
        os._exit(KILLED_EXIT_CODE)


def parse(spec: str) -> KillAt:
    step, _, count = spec.partition(":")
    return KillAt(step, int(count or 1))


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[0] != "--kill-at" or "--" not in argv:
        raise SystemExit("usage: python -m tests.faults --kill-at STEP[:N] -- COMMAND ARGS...")
    install_hooks(parse(argv[1]))
    from tokenmill.cli import main as tokenmill

    tokenmill(argv[argv.index("--") + 1:])


if __name__ == "__main__":
    main(sys.argv[1:])
