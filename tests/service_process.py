"""A tokenmill service (`consume`, `sink`) as a child process of a test:
started, killed, frozen and woken like a real one, with its JSON log read
back as events. Each start appends to the same log file; `mark()` says
where the log ends now, so a test reads only what came after."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]


def entry(kill_at: str | None = None, faults: Sequence[str] = ()) -> list[str]:
    """The module a service runs from: under tests/faults.py with a fault,
    else the tokenmill command line."""
    injected = [*(["--kill-at", kill_at] if kill_at else []), *faults]
    return ["tests.faults", *injected, "--"] if injected else ["tokenmill.cli"]


def log_events(text: str, name: str | None = None) -> list[dict[str, Any]]:
    """The JSON events of a log (named `name`, or all)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                event = msgspec.json.decode(line)
            except msgspec.DecodeError:
                continue
            if isinstance(event, dict) and (name is None or event.get("event") == name):
                out.append(event)
    return out


class ServiceProcess:
    """Parameters: `args` (the command line), `log_path`, `env` (None: this
    process's, unbuffered)."""

    def __init__(self, args: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.start_mark = 0  # where the log ended when it last started

    def start(self) -> Any:
        self.starts += 1
        self.start_mark = self.mark()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it open
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.args], stdout=log, stderr=subprocess.STDOUT,
            env={**(self.env or os.environ), "PYTHONUNBUFFERED": "1"}, cwd=REPO)
        log.close()
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def mark(self) -> int:
        """Where the log ends now: `events(..., since=mark)` reads after it."""
        return len(self.log())

    def events(self, name: str | None = None, since: int = 0) -> list[dict[str, Any]]:
        return log_events(self.log()[since:], name)

    def stop(self) -> None:
        """SIGCONT (in case it is frozen), SIGTERM, and SIGKILL after 30 s."""
        if self.running():
            self.signal(signal.SIGCONT)
            self.terminate()
            try:
                self.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
