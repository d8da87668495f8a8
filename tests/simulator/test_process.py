"""The simulator as a subprocess: CLI, kill -9 and restart, crash-after."""

from __future__ import annotations

import subprocess
import sys
import urllib.error

import pytest

from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess, running_simulator_process
from sglang_sim.server import CRASH_EXIT_CODE
from tests.simulator.sim_helpers import chat, http, user

pytestmark = pytest.mark.timeout(60)


def test_same_text_across_kill_and_restart() -> None:
    config = SimulatorConfig(zero_delay=True, seed=5, tool_call_parser="qwen25")
    with running_simulator_process(config) as sim:
        _, before = chat(sim.base_url, user("same after restart", max_tokens=2000))
        port, pid = sim.port, sim.pid
        sim.kill()  # SIGKILL
        assert sim.poll() is not None
        with pytest.raises(urllib.error.URLError):
            http("GET", sim.base_url + "/health", timeout=2)
        sim.start()
        assert sim.port == port and sim.pid != pid
        assert http("GET", sim.base_url + "/health")[0] == 200
        _, after = chat(sim.base_url, user("same after restart", max_tokens=2000))
    assert before["choices"][0]["message"] == after["choices"][0]["message"]
    assert before["usage"] == after["usage"]


def test_crash_after_exits_the_process() -> None:
    sim = SimulatorProcess(SimulatorConfig(zero_delay=True, crash_after=2))
    sim.start()
    try:
        assert chat(sim.base_url, user("one"))[0] == 200
        assert chat(sim.base_url, user("two"))[0] == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            chat(sim.base_url, user("three"), timeout=5)
        assert sim.wait(10) == CRASH_EXIT_CODE
    finally:
        sim.kill()


def test_cli_help_and_bad_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "tokenmill.cli", "sim-sglang", "--help"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0
    for flag in ("--max-running-requests", "--time-scale", "--zero-delay", "--error-rate",
                 "--crash-after", "--tool-call-parser", "--enable-cache-report",
                 "--log-format"):
        assert flag in out.stdout
    bad = subprocess.run([sys.executable, "-m", "tokenmill.cli", "sim-sglang",
                          "--error-rate", "2", "--port", "0"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert bad.returncode != 0 and "error_rate" in bad.stderr
