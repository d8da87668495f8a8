"""The two sides of bench/bench_seed_run.py, timed the same way: wall clock
from launch to the moment the last result is durable in S3 (or the DLQ).

- tokenmill: `tokenmill produce` launched at t0; seven `tokenmill consume`
  (one per server) and one `tokenmill sink` launched as soon as the run is
  registered (what an operator starting them by hand can do at best); the
  end is the first moment the run's committed progress says every prompt is
  persisted (`RunProgress.sink_done`: the sink's commit of its last S3
  batch or DLQ record), polled every second, so the figure is late by at
  most one poll and one read;
- baseline: bench/plain_loop.py, the seed's loop (one shared queue over the
  same servers, the same concurrency per server, the exact request bodies
  tokenmill sent, in the seed's order: input files in order, tools last),
  writing batches of 500 answers to the same S3 server; the end is the end
  of its last upload, as it reports it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from bench.consume_sides import consume_argv
from bench.seed_checks import stream_values
from bench.seed_sampler import Sampler
from bench.services import ROOT, child_env, tokenmill_argv
from bench.timing import Exited, Launched
from consumer.sglang_client import request_body
from devstack.processes import free_port
from schemas import GenerationSettings, PromptRecord
from tokenmill import progress, run_done
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

POLL_S = 1.0
EXIT_AFTER_DONE_S = 180.0


@dataclass
class Probe:
    """One timed look: `tokenmill status` (a process, launch to exit) or a
    worker's done-check (`run_done.look`, in this process)."""

    at: float  # epoch seconds when it started
    seconds: float
    done_share: float  # committed results / prompts when it started
    ok: bool
    label: str = ""  # "1%", "50%", "100%" at those points


@dataclass
class TokenmillRun:
    run_id: str
    launched_at: float
    registered_at: float
    generation_done_at: float
    ended_at: float  # sink_done first seen
    exits: dict[str, Exited]
    status: list[Probe]
    done_checks: list[Probe]
    notes: list[str] = field(default_factory=list)


@dataclass
class BaselineRun:
    launched_at: float
    ended_at: float  # end of the last S3 upload
    last_answer_at: float
    exit: Exited
    objects: int
    bytes: int


class StatusProbes:
    """Runs `tokenmill status --run R --json` on request, one at a time, in
    a thread (each is a process start: the latency an operator sees)."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.argv = tokenmill_argv("status", "--run", run_id, "--json")
        self.env = child_env(settings)
        self.results: list[Probe] = []
        self._asks: queue.Queue[tuple[float, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="status-probes", daemon=True)
        self._thread.start()

    def ask(self, done_share: float, label: str = "") -> None:
        self._asks.put((done_share, label))

    def close(self) -> None:
        self._asks.put(None)
        self._thread.join(120)

    def _loop(self) -> None:
        while (asked := self._asks.get()) is not None:
            share, label = asked
            started, t0 = time.time(), time.monotonic()
            try:
                done = subprocess.run(self.argv, env=self.env, cwd=ROOT, capture_output=True,
                                      timeout=120)
                ok = done.returncode == 0
            except subprocess.TimeoutExpired:
                ok = False
            self.results.append(Probe(started, time.monotonic() - t0, share, ok, label))


def wait_registered(settings: Settings, run_id: str, producer: Launched,
                    timeout_s: float = 1800.0) -> float:
    """Epoch seconds when the run's spec is readable in the registry."""
    registry = RunRegistry(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exited = producer.poll_exit()
        if exited is not None and exited.code != 0:
            raise RuntimeError(f"tokenmill produce exited with {exited.code}; log: {producer.log}")
        if registry.find(run_id) is not None:
            return time.time()
        time.sleep(0.5)
    raise RuntimeError(f"run {run_id} was not registered within {timeout_s:.0f}s")


class Marks:
    """Which of the fractions of the run (1%, 50%, 100%) have been probed."""

    def __init__(self, fractions: tuple[float, ...]) -> None:
        self.left = list(fractions)

    def crossed(self, share: float) -> list[str]:
        hit = [f for f in self.left if share >= f]
        self.left = [f for f in self.left if f not in hit]
        return [f"{f:.0%}" for f in hit]


def monitor(settings: Settings, run_id: str, total: int, procs: dict[str, Launched],
            probes: StatusProbes, status_every_s: float, timeout_s: float
            ) -> tuple[float, float, list[Probe]]:
    """Look at the run every POLL_S (the worker's own done-check, timed)
    until the sink has persisted everything; asks for `status` at 1%, 50%,
    100% and every `status_every_s`. Returns (generation done at, sink done
    at, done-checks)."""
    checks: list[Probe] = []
    marks = Marks((0.01, 0.5, 1.0))
    generation_done_at = 0.0
    next_status = time.time()
    deadline = time.monotonic() + timeout_s
    tail = progress.ProgressTail(settings, run_id)
    try:
        while time.monotonic() < deadline:
            started, t0 = time.time(), time.monotonic()
            state = run_done.look(tail)
            seconds = time.monotonic() - t0
            share = state.generated / total if state is not None else 0.0
            labels = marks.crossed(share) if state is not None else []
            checks.append(Probe(started, seconds, share, state is not None, ",".join(labels)))
            for label in labels:
                probes.ask(share, label)
            if not labels and time.time() >= next_status:
                probes.ask(share)
                next_status = time.time() + status_every_s
            if state is not None and state.generation_done and not generation_done_at:
                generation_done_at = time.time()
            if state is not None and state.sink_done:
                return generation_done_at or time.time(), time.time(), checks
            for name, proc in procs.items():
                exited = proc.poll_exit()
                if exited is not None and exited.code != 0:
                    raise RuntimeError(f"{name} exited with {exited.code}; log: {proc.log}")
            time.sleep(max(POLL_S - (time.monotonic() - t0), 0.0))
        raise RuntimeError(f"the run was not persisted within {timeout_s:.0f}s")
    finally:
        tail.close()


def run_tokenmill(settings: Settings, run_id: str, files: list[Path], urls: list[str],
                  sampler: Sampler, *, total: int, concurrency: int, max_tokens: int,
                  status_every_s: float, work: Path, timeout_s: float) -> TokenmillRun:
    env = child_env(settings)
    procs: dict[str, Launched] = {}

    def launch(name: str, argv: list[str]) -> None:
        procs[name] = Launched(argv, env=env, log=work / f"{name}.log", cwd=ROOT)
        sampler.watch(name, procs[name].proc.pid)

    launch("producer", tokenmill_argv("produce", *map(str, files), "--run", run_id, "--gpus",
                                      str(len(urls)), "--max-tokens", str(max_tokens),
                                      "--model", "sim"))
    launched_at = procs["producer"].launched_at
    probes: StatusProbes | None = None
    try:
        registered_at = wait_registered(settings, run_id, procs["producer"])
        for i, url in enumerate(urls):
            port = free_port()
            launch(f"worker{i}", consume_argv(run_id, url, f"w{i}", "--concurrency",
                                              str(concurrency), "--metrics-port", str(port)))
            sampler.watch_metrics(f"worker{i}", f"http://127.0.0.1:{port}/metrics")
        launch("sink", tokenmill_argv("sink", "--run", run_id, "--until-done",
                                      "--instance", "sink0"))
        probes = StatusProbes(settings, run_id)
        generation_done_at, ended_at, checks = monitor(settings, run_id, total, procs, probes,
                                                       status_every_s, timeout_s)
        exits = {name: p.wait_or_kill(EXIT_AFTER_DONE_S) for name, p in procs.items()}
    finally:
        if probes is not None:
            probes.close()
        for p in procs.values():
            p.kill()
    notes = [f"{name} was still running {EXIT_AFTER_DONE_S:.0f} s after the run was "
             "persisted; killed" for name, p in procs.items() if p.killed]
    failed = {n: e.code for n, e in exits.items() if e.code != 0 and not procs[n].killed}
    if failed:
        raise RuntimeError(f"exit codes {failed}; logs in {work}")
    return TokenmillRun(run_id, launched_at, registered_at, generation_done_at, ended_at,
                        exits, probes.results if probes else [], checks, notes)


def seed_order_bodies(settings: Settings, run_id: str, files: list[Path], out: Path,
                      generation: GenerationSettings) -> list[str]:
    """The exact request bodies tokenmill sent for the run's prompts, written
    to `out` in the seed's order (input files as given, lines in order: the
    tool prompts last); returns the published prompt ids (read with kafka-python)."""
    rank = {f.name: i for i, f in enumerate(files)}
    decoder = msgspec.json.Decoder(PromptRecord)
    keyed: list[tuple[int, int, bytes, str]] = []
    for value in stream_values(settings.bootstrap_servers, f"tokenmill.{run_id}.prompts"):
        prompt = decoder.decode(value)
        body = msgspec.json.encode(request_body(prompt, generation))
        keyed.append((rank.get(Path(prompt.source).name, len(rank)), prompt.line, body,
                      prompt.id))
    keyed.sort(key=lambda k: (k[0], k[1]))
    with out.open("wb") as fh:
        for _, _, body, _ in keyed:
            fh.write(body + b"\n")
    return [prompt_id for _, _, _, prompt_id in keyed]


def run_baseline(settings: Settings, bodies: Path, urls: list[str], sampler: Sampler, *,
                 concurrency: int, batch: int, prefix: str, work: Path) -> BaselineRun:
    argv = [sys.executable, str(ROOT / "bench" / "plain_loop.py"), "--bodies", str(bodies),
            "--concurrency", str(concurrency), "--s3-bucket", str(settings.s3_bucket),
            "--s3-prefix", prefix, "--batch-size", str(batch)]
    if settings.s3_endpoint_url:
        argv += ["--s3-endpoint-url", settings.s3_endpoint_url]
    for url in urls:
        argv += ["--url", url]
    proc = Launched(argv, env=os.environ, log=work / "baseline.log", cwd=ROOT)
    sampler.watch("baseline", proc.proc.pid)
    exited = proc.wait(6 * 3600)
    if exited.code != 0:
        raise RuntimeError(f"the baseline loop failed ({exited.code}); log: {proc.log}")
    report = json.loads(exited.stdout.strip().splitlines()[-1])
    return BaselineRun(proc.launched_at, report["last_at"], report["last_answer_at"], exited,
                       int(report["objects"]), int(report["bytes"]))
