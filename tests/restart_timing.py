"""What a restarted member's start may cost (README Guarantees, 6: a member
with nothing undecided starts at once), for the worker's and the sink's
restart tests.

The process is started through this module's entry point, which imports the
command's modules, logs `{"event": "imported", ...}` with the time and its
main thread's CPU figures, and runs the command:

    python -m tests.restart_timing consume --run r ...

What is bounded is the time the main thread *waited on others* from then
to its first request (or upload): the wall time less the time it ran and
the time it was runnable but waited for a CPU (/proc schedstat). A loaded
machine stretches the start's own work, not this; a read that waits for an
undecided transaction is all this (~20 s: the transaction timeout of a
member that died mid-commit, then the coordinator's next check).

KAFKA_START_S: a dozen broker round trips on localhost (metadata,
init_transactions, the run registry's and the counters' reads, the group's
session timeout, the committed offsets, the first fetch), the server checks
(SGLang's models, or the S3 bucket and the probe of a partition's earlier
objects), and the group moving partitions to the newcomer: the member that
holds them learns it at its next heartbeat, revokes (committing what is
ready), and the newcomer gets them at its next one, every 0.6 s at
--session-timeout 6. Measured here at 1.2-2.6 s with the machine loaded; 6 s
leaves room for a broker that answers slowly under load, and is under a
third of the 20 s a waiting read adds."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

KAFKA_START_S = 6.0
ENTRY = "tests.restart_timing"


def thread_times(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of the main
    thread of process `pid` so far (/proc/<pid>/task/<pid>/schedstat)."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def imported(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The last start's "imported" line."""
    marks = [e for e in events if e.get("event") == "imported"]
    assert marks, "no 'imported' line: not started through tests.restart_timing"
    return marks[-1]


def waited_s(mark: dict[str, Any], pid: int) -> tuple[float, float]:
    """(wall seconds since `mark`, of which the main thread of `pid` spent
    neither on a CPU nor waiting for one): what it waited for on others."""
    on_cpu, runnable = thread_times(pid)
    wall = time.time() - mark["at"]
    return wall, wall - (on_cpu - mark["cpu_s"]) - (runnable - mark["runnable_s"])


def first_line_at(path: Path, timeout_s: float) -> float:
    """time.time() at which `path` has a first line (polled every 10 ms)."""
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.stat().st_size > 0):
        assert time.monotonic() < deadline, f"nothing in {path} within {timeout_s}s"
        time.sleep(0.01)  # poll of a wait loop
    return time.time()


def main(argv: list[str]) -> None:
    from tokenmill.cli import COMMANDS
    from tokenmill.cli import main as tokenmill

    importlib.import_module(COMMANDS[argv[0]].split(":")[0])
    on_cpu, runnable = thread_times(os.getpid())
    print(json.dumps({"event": "imported", "at": time.time(), "cpu_s": on_cpu,
                      "runnable_s": runnable}), flush=True)
    tokenmill(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
