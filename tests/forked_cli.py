"""Many short `tokenmill` command lines, each in a process of its own, for
the price of one interpreter start.

`python -m tests.forked_cli` imports the CLI and every subcommand's module
once, then reads JSON requests from stdin, one per line (`{"id", "args",
"env", "cwd"}`), and forks a child per request: the child takes the
request's environment (in full: nothing of the parent's is kept), working
directory and argv, sends its stdout and stderr to files of its own, and
runs `tokenmill.cli.main()`; the parent answers one JSON line per request,
`{"id", "code", "stderr"}`, in the order they end. A child is a real process
(its own pid, file descriptors, exit code), only its imports are inherited,
so a case that needs a fresh interpreter's import-time behaviour does not
belong here. Our modules read the environment when called, not when
imported (`grep -rn os.environ`), which is what makes this faithful.

Used by tests/foundation/test_bad_settings.py: its 76 cases took 66 s as
fresh interpreters in a CI run (about a CPU second each, the interpreter and
its imports), and under 10 s forked.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

PARALLEL = 4  # children at a time: most wait on a 1 s connect timeout


@dataclass(frozen=True)
class Request:
    id: str
    args: list[str]
    env: dict[str, str]
    cwd: str


def _child(request: Request, stderr_path: str) -> None:
    """Never returns: becomes the command and exits with its code."""
    code = 70  # EX_SOFTWARE if the command itself never decides
    try:
        out = os.open(os.devnull, os.O_WRONLY)
        err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.environ.clear()
        os.environ.update(request.env)
        os.chdir(request.cwd)
        sys.argv = ["tokenmill", *request.args]
        from tokenmill import cli

        try:
            cli.main(request.args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
    except BaseException:  # an uncaught error is a traceback on stderr, as in a real run
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(requests: Iterable[Request], scratch: str) -> Iterator[dict[str, Any]]:
    """Fork a child per request, PARALLEL at a time; yield each one's outcome."""
    pending = list(requests)
    running: dict[int, tuple[Request, str]] = {}
    while pending or running:
        while pending and len(running) < PARALLEL:
            request = pending.pop(0)
            stderr_path = os.path.join(scratch, f"{len(running)}-{os.urandom(4).hex()}.err")
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, stderr_path)
            running[pid] = (request, stderr_path)
        pid, status = os.wait()
        if pid not in running:
            continue
        request, stderr_path = running.pop(pid)
        with open(stderr_path, encoding="utf-8", errors="replace") as fh:
            stderr = fh.read()
        os.unlink(stderr_path)
        yield {"id": request.id, "code": os.waitstatus_to_exitcode(status), "stderr": stderr}


def main() -> None:
    from tokenmill import cli

    for target in cli.COMMANDS.values():  # what every child would import anyway
        importlib.import_module(target.split(":", 1)[0])
    requests = [Request(**json.loads(line)) for line in sys.stdin if line.strip()]
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as scratch:
        for outcome in serve(requests, scratch):
            print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
