"""The pipeline under a supervisor, for the broker-fault tests
(test_broker_faults.py, test_broker_bounces.py): workers and a sink that are
restarted whenever they exit non-zero (as systemd's Restart=on-failure
would), and the simulated GPUs' own count of the run's pace. The tests publish the
run's prompts in stages (tests/consumer/pipeline.py's Publisher), so that
the run cannot end before their last fault (its last prompts go out after
it), whatever the machine's speed.
What they wrote is read back with kafka-python and boto3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import REPO, Publisher, create_run, sim_metrics
from tests.kafka_helpers import read_all
from tests.sink.sink_helpers import s3_ids
from tokenmill.kafka import topics

# ~0.3 s per request
PACED = SimulatorConfig(decode_rate=200.0, length_median=60, length_sigma=0.4, length_max=200,
                        max_running_requests=256, prefill_rate=0)
RESTART_DELAY_S = 1.0  # systemd's RestartSec


class Supervised:
    """A tokenmill service restarted whenever it exits non-zero, one second
    later, like a systemd unit with Restart=on-failure; done once it exits 0."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log = logs / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.exit_codes: list[int] = []

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=REPO)

    def tend(self) -> bool:
        """Restart after a failure; True once it has finished (exit 0)."""
        assert self.proc is not None
        code = self.proc.poll()
        if code is None:
            return False
        if code == 0:
            return True
        self.exit_codes.append(code)
        self.restarts += 1
        time.sleep(RESTART_DELAY_S)  # a paced outage: down for systemd's RestartSec
        self.start()
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Supervisor:
    def __init__(self, services: list[Supervised]) -> None:
        self.services = services
        self.finished: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Supervisor:
        for service in self.services:
            service.start()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):  # poll of a wait loop
            for service in self.services:
                if service.name not in self.finished and service.tend():
                    self.finished.add(service.name)

    def wait_all(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.finished) < len(self.services):
            if time.monotonic() > deadline:
                tails = {s.name: s.log.read_text(errors="replace")[-1500:]
                         for s in self.services if s.name not in self.finished}
                raise AssertionError(f"not finished in {timeout_s}s: {tails}")
            time.sleep(0.5)  # poll of a wait loop

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for service in self.services:
            service.stop()


def services(settings, run_id: str, urls: list[str], logs: Path) -> list[Supervised]:  # type: ignore[no-untyped-def]
    """A worker per simulated GPU, and a sink."""
    env = {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
           "TOKENMILL_S3_BUCKET": settings.s3_bucket or "", "TOKENMILL_LOG_FORMAT": "json",
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    cli = [sys.executable, "-m", "tokenmill.cli"]
    workers = [Supervised(f"worker{i}", [*cli, "consume", "--run", run_id, "--sglang-url", url,
                                         "--instance", f"w{i}", "--until-done",
                                         "--concurrency", "16", "--commit-interval", "0.5",
                                         "--session-timeout", "6"], env, logs)
               for i, url in enumerate(urls)]
    sink = Supervised("sink", [*cli, "sink", "--run", run_id, "--instance", "s0", "--until-done",
                               "--batch-size", "50", "--max-batch-age", "1",
                               "--session-timeout", "6", "--create-bucket"], env, logs)
    return [*workers, sink]


class Pace:
    """How far the run is, from the simulated GPUs themselves (`/metrics`):
    requests served and running. Not from the progress topic, whose view can
    stand still for a minute after a broker restart (a member's transaction
    left open holds its last stable offset back) while the run races on."""

    def __init__(self, urls: list[str], supervisor: Supervisor) -> None:
        self.urls, self.supervisor = urls, supervisor

    def reading(self) -> tuple[int, int]:
        """(requests served, requests running), one scrape of each server."""
        scraped = [sim_metrics(url) for url in self.urls]
        return (int(sum(m.get("sglang:num_requests_total", 0.0) for m in scraped)),
                int(sum(m.get("sglang:num_running_reqs", 0.0) for m in scraped)))

    def served(self) -> int:
        return self.reading()[0]

    def workers_done(self) -> bool:
        """A worker exited 0: with --until-done, the run is fully generated."""
        return any(name.startswith("worker") for name in self.supervisor.finished)

    def wait_mid_run(self, at_least: int, timeout_s: float) -> int:
        """Waits until `at_least` requests were served and some are running;
        fails at once if a worker finished. Returns the served count."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert not self.workers_done(), f"a worker finished before {at_least} requests"
            served, running = self.reading()
            if served >= at_least and running > 0:
                return served
            assert time.monotonic() < deadline, f"served {served} (< {at_least}) in {timeout_s}s"
            time.sleep(0.2)  # poll of a wait loop


@dataclass
class SupervisedRun:
    publisher: Publisher
    pace: Pace
    supervisor: Supervisor
    services: list[Supervised]


@contextmanager
def supervised_run(settings, run_id: str, prompts, logs: Path) -> Iterator[SupervisedRun]:  # type: ignore[no-untyped-def]
    """A run of `prompts` on 6 partitions, three simulated GPUs and the
    supervised services; the first 600 prompts are out, the rest are the
    test's to publish (`publisher`), the last ones after its last fault."""
    spec = create_run(settings, run_id, partitions=6)
    publisher = Publisher(settings, spec, prompts)
    publisher.to(600)
    with ExitStack() as stack:
        urls = [stack.enter_context(running_simulator(PACED)) for _ in range(3)]
        supervised = services(settings, run_id, urls, logs)
        supervisor = stack.enter_context(Supervisor(supervised))
        yield SupervisedRun(publisher, Pace(urls, supervisor), supervisor, supervised)


def exactly_once(settings, run_id: str, prompts) -> None:  # type: ignore[no-untyped-def]
    dlq = read_all(settings.bootstrap_servers, topics.dlq_topic(run_id), timeout_s=120)
    everywhere = Counter(s3_ids(settings)) + Counter(r.key.decode() for r in dlq)
    assert [k for k, v in everywhere.items() if v > 1] == []
    assert set(everywhere) == {p.id for p in prompts}


def own_stack(private_stack, monkeypatch, brokers: int):  # type: ignore[no-untyped-def]
    stack = private_stack(brokers=brokers)
    for name, value in stack.env().items():  # S3 credentials for boto3 and the services
        monkeypatch.setenv(name, value)
    return stack


def _librdkafka_abort(line: str) -> bool:
    """librdkafka 2.x was seen to abort the process in a broker bounce, a
    few seconds after a transaction whose offsets the coordinator refused
    (ILLEGAL_GENERATION) was aborted: `rd_kafka_enq_once_del_source_return:
    Assertion 'eonce->refcnt > 0' failed`. A bug of the library, not ours
    to catch; it is one line, the supervisor restarts the service, and
    exactly-once holds (checked by the callers)."""
    return "Assertion" in line and "rd_kafka" in line


def exits_were_clean(services: list[Supervised]) -> None:
    """Every exit the supervisor saw left one line saying why (a click
    `Error:` line, or the watchdog's), and no traceback; each was a service's
    own exit (1) or librdkafka's abort (SIGABRT), never another signal."""
    for service in services:
        text = service.log.read_text(errors="replace")
        assert "Traceback" not in text, f"{service.name}: {text[-2000:]}"
        explained = sum(1 for line in text.splitlines() if line.startswith("Error:")
                        or "exiting so that the supervisor restarts it" in line
                        or _librdkafka_abort(line))
        assert explained >= service.restarts, (service.name, service.exit_codes)
        assert set(service.exit_codes) <= {1, -signal.SIGABRT}, (service.name,
                                                                 service.exit_codes)
