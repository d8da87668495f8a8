"""Worker memory over time: does a worker's resident set creep while it runs?

Two workers run side by side in the same invocation, on the same broker,
each on a run of its own with a paced simulated GPU of its own (~0.5-1.5 s
per request, `--concurrency 72`, the seed's per-server cap): tokenmill as it
ships (glibc's malloc arenas capped at two, tokenmill/malloc_arenas.py) and,
as the baseline, the same worker with the cap lifted (`MALLOC_ARENA_MAX=64`
in its environment, which the cap leaves alone: glibc's own default of 8 per
core). RSS from /proc/<pid>/statm every 2 s for `--seconds`; the figure is
each worker's RSS at the end over its RSS at 10% of the time (the seed run's
target: <= 1.1), with the slope in MiB an hour beside it. The runs hold more
prompts than the time lets them finish, so both workers are busy throughout.

    python bench/bench_worker_memory.py [--seconds 420] [--prompts 60000]
                                        [--out bench/results/worker_memory.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.consume_sides import consume_argv, setup_run
from bench.figures import Figure, Recorder, console_table, ratio
from bench.seed_figures import FLAT_FROM, FLAT_LIMIT, growth, slope_per_hour, value_at
from bench.seed_sampler import proc_usage
from bench.services import ROOT, bench_settings
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tokenmill.settings import Settings

console = Console(width=200)

PACED = SimulatorConfig(decode_rate=200.0, length_median=150, length_sigma=0.5, length_max=600,
                        max_running_requests=128, prefill_rate=0)
CONCURRENCY = 72
PARTITIONS = 4
SIDES = {"capped (as shipped)": {}, "uncapped (MALLOC_ARENA_MAX=64)": {"MALLOC_ARENA_MAX": "64"}}


def run(settings: Settings, seconds: float, prompts: int, work: Path) -> list[Figure]:
    sims = {name: SimulatorProcess(PACED) for name in SIDES}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in SIDES}
    try:
        for i, (name, extra) in enumerate(SIDES.items()):
            bench_run = setup_run(settings, prompts, PARTITIONS, 1024)
            url = sims[name].start()
            env = {**os.environ, **extra, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
                   "TOKENMILL_LOG_FORMAT": "json", "TOKENMILL_LOG_LEVEL": "warning"}
            argv = consume_argv(bench_run.spec.run_id, url, f"mem{i}", "--concurrency",
                                str(CONCURRENCY))
            with (work / f"worker{i}.log").open("wb") as log:
                procs[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               cwd=ROOT)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; log in {work}")
                usage = proc_usage(proc.pid)
                if usage is not None:
                    samples[name].append((elapsed, usage[0] / 2**20))
            console.print(f"{elapsed:5.0f}s  " + "  ".join(
                f"{name}: {s[-1][1]:.0f} MiB" for name, s in samples.items() if s), end="\r")
            time.sleep(2)
        console.print()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for sim in sims.values():
            sim.terminate()
    grown = {name: growth(s, 0.0, seconds) for name, s in samples.items()}
    ours, base = list(SIDES)
    details = {name: {"at_10pct_mib": round(value_at(s, seconds * FLAT_FROM), 1),
                      "end_mib": round(s[-1][1], 1), "peak_mib": round(max(r for _, r in s), 1),
                      "slope_mib_per_hour": round(slope_per_hour(s, seconds * FLAT_FROM), 1),
                      "samples": len(s)}
               for name, s in samples.items()}
    return [Figure(
        name=f"worker RSS end / RSS at 10% of {seconds:.0f} s, paced run, {CONCURRENCY} in flight",
        unit="x", tokenmill=round(grown[ours], 3), baseline=round(grown[base], 3),
        baseline_name=base, ratio=ratio(grown[ours], grown[base]), target=f"<= {FLAT_LIMIT}",
        met=grown[ours] <= FLAT_LIMIT,
        method="/proc/<pid>/statm every 2 s, both workers side by side on one broker, "
               "each on its own run and simulated GPU; the value nearest 10% of the time and "
               "the last",
        details=details)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=420.0)
    parser.add_argument("--prompts", type=int, default=60000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    recorder = Recorder("bench_worker_memory")
    with bench_settings() as settings, tempfile.TemporaryDirectory() as tmp:
        figures = run(settings, args.seconds, args.prompts, Path(tmp))
    recorder.write(args.out, figures)
    console.print(console_table("worker memory", figures))
    for name, detail in figures[0].details.items():
        console.print(f"{name}: {detail}")


if __name__ == "__main__":
    main()
