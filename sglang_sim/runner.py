"""Run a simulator for tests: in a background thread, or as a real subprocess.

* ``running_simulator(config)`` -> base URL; the app runs in a daemon thread
  with its own event loop on a free port, and is stopped on exit.
* ``SimulatorThread`` is the same with a handle (``.state`` for white-box
  checks, ``.stop()``).
* ``SimulatorProcess`` starts ``python -m tokenmill.cli sim-sglang ...`` so a
  test can ``kill()`` it (SIGKILL), ``terminate()`` it, or ``restart()`` it on
  the same port; ``running_simulator_process(config)`` wraps it.

Ready means listening: the thread runner returns after the socket is bound;
the process runner waits for the ``listening on`` line the command prints.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Self

from aiohttp import web

from sglang_sim.command import READY_PREFIX, bound_port
from sglang_sim.config import SimulatorConfig, to_cli_args
from sglang_sim.server import STATE, SimulatorState, create_app

START_TIMEOUT = 30.0


class SimulatorThread:
    """An in-process simulator on its own loop in a daemon thread."""

    def __init__(self, config: SimulatorConfig | None = None, port: int = 0,
                 host: str = "127.0.0.1") -> None:
        self.config = config or SimulatorConfig()
        if self.config.crash_after is not None:
            raise ValueError("crash_after exits the process: use SimulatorProcess")
        self.host = host
        self.port = port
        self.base_url = ""
        self.state: SimulatorState | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, name="sim-sglang", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT):
            raise TimeoutError("simulator thread did not start")
        if self._error is not None:
            raise RuntimeError("simulator thread failed to start") from self._error
        return self.base_url

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._cleanup())
            loop.close()

    async def _start(self) -> None:
        app = create_app(self.config)
        self.state = app[STATE]
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096)
        await site.start()
        self.port = bound_port(site)
        self.base_url = f"http://{self.host}:{self.port}"

    async def _cleanup(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if not t.done() and t is not current]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(START_TIMEOUT)
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def running_simulator(config: SimulatorConfig | None = None, port: int = 0) -> Iterator[str]:
    """Base URL of a simulator running in a background thread for the block."""
    sim = SimulatorThread(config, port)
    sim.start()
    try:
        yield sim.base_url
    finally:
        sim.stop()


def command_line(config: SimulatorConfig, port: int) -> list[str]:
    """argv that starts `config` as a subprocess on `port`."""
    args = [arg for arg in to_cli_args(config)]
    # the port is passed explicitly; drop the config's own
    cleaned: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--port":
            skip = True
            continue
        cleaned.append(arg)
    return [sys.executable, "-m", "tokenmill.cli", "sim-sglang", "--port", str(port),
            "--log-format", "json", "--log-level", "warning", *cleaned]


class SimulatorProcess:
    """The simulator as a child process: killable, restartable on the same port."""

    def __init__(self, config: SimulatorConfig | None = None, port: int = 0,
                 env: dict[str, str] | None = None, own_session: bool = False) -> None:
        self.config = config or SimulatorConfig()
        self.port = port
        self.env = env
        # its own session, as a GPU host runs each server (a unit or a
        # container): the scheduler's autogroups share CPU by session
        self.own_session = own_session
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self._stderr: typing.IO[bytes] | None = None

    def start(self, timeout: float = START_TIMEOUT) -> str:
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _close
        self.proc = subprocess.Popen(
            command_line(self.config, self.port), stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, env=env, start_new_session=self.own_session,
        )
        url = self._wait_ready(timeout)
        self.base_url = url
        self.port = int(url.rsplit(":", 1)[1])
        return url

    def _wait_ready(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(deadline - time.monotonic(), 0.01)):
                    continue
                line = self.proc.stdout.readline()
                if not line:
                    code = self.proc.wait()
                    raise RuntimeError(f"simulator exited with {code} before ready: "
                                       f"{self.stderr_tail()}")
                if line.startswith(READY_PREFIX):
                    return line[len(READY_PREFIX):].strip()
        finally:
            sel.close()
        self.kill()
        raise TimeoutError("simulator process did not report ready")

    def stderr_tail(self, limit: int = 2000) -> str:
        """The end of the child's stderr (its logs), for failure messages."""
        if self._stderr is None or self._stderr.closed:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, like a GPU node dying."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close()

    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (graceful stop); SIGKILL if it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def restart(self, timeout: float = START_TIMEOUT) -> str:
        """Stop (if running) and start again on the same port."""
        self.terminate()
        return self.start(timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


@contextmanager
def running_simulator_process(config: SimulatorConfig | None = None,
                              port: int = 0) -> Iterator[SimulatorProcess]:
    """A simulator subprocess for the block (terminated at the end)."""
    sim = SimulatorProcess(config, port)
    sim.start()
    try:
        yield sim
    finally:
        sim.terminate()
