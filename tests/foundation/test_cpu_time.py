"""The CPU figure of tests/cpu_time.py counts a child the test waited for:
the services, brokers and simulators a test starts are most of its CPU."""

from __future__ import annotations

import subprocess
import sys

from tests import cpu_time

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"


def test_the_cpu_of_a_reaped_child_is_counted() -> None:
    before = cpu_time.cpu_s()
    subprocess.run([sys.executable, "-c", BUSY], check=True, timeout=60)
    assert cpu_time.cpu_s() - before >= 0.5
