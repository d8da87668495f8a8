"""CPU seconds per test, beside pytest's wall-clock `--durations`.

The suite runs three test processes on two cores and is bound by CPU (a CI
run beside a busy core: 10% idle on average): a test's wall time there is
mostly its neighbours' load, so cutting CI time means cutting CPU work, and
this is the list that ranks it. A test's figure is its test process's own CPU
plus that of every child it reaped (services, brokers, simulators: waited
for, hence counted by `RUSAGE_CHILDREN`), over its setup, call and teardown.
Counted nowhere: the session's shared stack (the controller starts it) and
processes no test reaps (a dev stack's daemonized nodes); in a CI run the
counted total was about 60% of the CPU the main line used.
Each test's figure goes into the junit XML as the property `cpu_s`; the
largest are listed at the end of the run (`--cpu-durations N`, 0 for none).
The hooks are tests/conftest.py's (imported there)."""

from __future__ import annotations

import resource
from collections.abc import Generator

import pytest

_STARTED = pytest.StashKey[float]()


def cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that used the most CPU seconds (with children)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    yield
    started = item.stash.get(_STARTED, None)
    if started is not None:
        item.user_properties.append(("cpu_s", round(cpu_s() - started, 2)))


class CpuReport:
    """Collects the teardown reports' `cpu_s` (from every xdist worker) and
    lists the largest in the terminal summary."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.figures: list[tuple[float, str]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            cpu = dict(report.user_properties).get("cpu_s")
            if isinstance(cpu, (int, float)):
                self.figures.append((float(cpu), report.nodeid))

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.figures:
            return
        total = sum(cpu for cpu, _ in self.figures)
        terminalreporter.write_sep("=", f"most CPU, with children ({total:.0f} s in all)")
        for cpu, nodeid in sorted(self.figures, reverse=True)[:self.count]:
            terminalreporter.write_line(f"{cpu:7.1f}s {nodeid}")


def register(config: pytest.Config) -> None:
    """From tests/conftest.py's pytest_configure: the report lives in the
    controller (or the only process), which sees every worker's reports."""
    count = config.getoption("--cpu-durations")
    if count and not hasattr(config, "workerinput"):
        config.pluginmanager.register(CpuReport(count), "tokenmill-cpu-report")
