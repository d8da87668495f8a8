"""What bench/bench_seed_run.py samples while a run goes on, from a thread:

- each watched process: resident set size and CPU seconds (user + system),
  read from /proc/<pid>/statm and /proc/<pid>/stat (Linux);
- each simulated GPU: `sglang:num_running_reqs`, `sglang:num_requests_total`
  and `sglang:generation_tokens_total` from its Prometheus `/metrics`, the
  same page a real SGLang server serves.

Samples are (epoch seconds, value) series, kept in memory (a 30-minute run
sampled every second is a few hundred thousand floats).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
GPU_METRICS = {"sglang:num_running_reqs": "running", "sglang:num_requests_total": "requests",
               "sglang:generation_tokens_total": "tokens"}
# A worker's own view (`tokenmill consume --metrics-port`): where a GPU's
# missing requests are (not fetched yet, fetched and waiting, or held back).
WORKER_METRICS = {"tokenmill_consumer_in_flight": "in_flight",
                  "tokenmill_consumer_lag": "lag",
                  "tokenmill_consumer_waiting_results": "waiting_results",
                  "tokenmill_consumer_assigned_partitions": "partitions"}


def proc_usage(pid: int) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds) of a live process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            rss_pages = int(fh.read().split()[1])
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # exited, not yet reaped
        return None
    return rss_pages * PAGE, (int(fields[11]) + int(fields[12])) / TICKS


def parse_metrics(text: str, wanted: dict[str, str] = GPU_METRICS) -> dict[str, float]:
    """The `wanted` values (metric name -> key) of one Prometheus page,
    summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in wanted:
            key = wanted[name]
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scrape(url: str, wanted: dict[str, str]) -> dict[str, float]:
    """One Prometheus page's `wanted` values; nothing when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return parse_metrics(response.read().decode(), wanted)
    except (OSError, ValueError):
        return {}


@dataclass
class Samples:
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    cpu: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    # gpu name -> metric ("running", "requests", "tokens") -> series
    gpu: dict[str, dict[str, list[tuple[float, float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    # gauges read by a function (e.g. a topic's bytes on disk), every `gauge_every` ticks
    gauges: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: defaultdict(list))
    # worker name -> metric ("in_flight", "lag", ...) -> series
    workers: dict[str, dict[str, list[tuple[float, float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))


class Sampler:
    """Samples every `interval_s`; `watch` adds a process at any time."""

    def __init__(self, gpus: dict[str, str], interval_s: float = 1.0,
                 gauges: dict[str, Callable[[], float]] | None = None,
                 gauge_every: int = 10) -> None:
        self.gpus = gpus  # name -> base URL
        self.interval_s = interval_s
        self.gauges = gauges or {}
        self.gauge_every = gauge_every
        self._ticks = 0
        self.samples = Samples()
        self._procs: dict[str, int] = {}
        self._workers: dict[str, str] = {}  # name -> metrics URL
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="seed-sampler", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self._procs[name] = pid

    def watch_metrics(self, name: str, url: str) -> None:
        """Sample a worker's Prometheus page (WORKER_METRICS) too."""
        with self._lock:
            self._workers[name] = url

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def sample_once(self) -> None:
        now = time.time()
        with self._lock:
            procs = dict(self._procs)
        for name, pid in procs.items():
            usage = proc_usage(pid)
            if usage is not None:
                self.samples.rss[name].append((now, float(usage[0])))
                self.samples.cpu[name].append((now, usage[1]))
        for name, url in self.gpus.items():
            for key, value in scrape(f"{url}/metrics", GPU_METRICS).items():
                self.samples.gpu[name][key].append((now, value))
        with self._lock:
            workers = dict(self._workers)
        for name, url in workers.items():
            for key, value in scrape(url, WORKER_METRICS).items():
                self.samples.workers[name][key].append((now, value))
        if self._ticks % self.gauge_every == 0:
            for name, read in list(self.gauges.items()):
                self.samples.gauges[name].append((now, read()))
        self._ticks += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample_once()
            self._stop.wait(max(self.interval_s - (time.monotonic() - started), 0.0))
