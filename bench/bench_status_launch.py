"""`tokenmill status` while a seed-size fleet starts (issue 27: `status`
under 2 s at every point of the run; the seed run's slowest look was the
one at its launch, 4.3 s, while everything else took 0.4-0.8 s).

The seed run's launch, as bench/bench_seed_run.py makes it: three brokers
(a private `dev up --brokers 3` stack), seven simulated GPUs, `tokenmill
produce --gpus 7` of the seed's 913,786 prompts (1.1 GB to publish), then
seven `tokenmill consume` workers and a sink launched together. From that
moment, `tokenmill status --run R --json` runs one at a time, alternately
from this checkout and from `--baseline-tree` (another checkout of
tokenmill, e.g. `git worktree add /tmp/before <commit>`, run with this
checkout's interpreter and dependencies), for `--seconds`: both sides see
the same launch, interleaved, and are timed the same way (process launch to
exit, wall clock). The first look goes to the baseline.

Figures: the slowest look of each side (target: this checkout's < 2 s), and
the median; per phase (0-15 s, 15-45 s, 45 s on) in the details.

`--sessions` places the processes for the scheduler, which (with autogroup,
on by default in Linux and on this machine) shares the CPU between
sessions first, then between the processes of each:
- `shared` (the default, and the basis of every figure before 2026-12-06):
  the workers, the sink, the producer, the simulators and every look in
  this benchmark's session, beside the stack's brokers and S3 server in
  theirs. A look then shares one session's share with sixteen busy
  processes, which no user's `status` does.
- `own`: each of them in its own session, as systemd starts each unit of
  deploy/ (and a GPU host each server), and each look in its own, as a
  command typed in a terminal runs. A look then competes with 20 sessions,
  not 5: for it, the more crowded of the two placements a user can have.

    python bench/bench_status_launch.py --baseline-tree /tmp/before [--seconds 100]
        [--sessions shared|own] [--data-dir DIR] [--out bench/results/status_launch.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_producer import generate
from bench.bench_seed_run import CONCURRENCY, GPUS, MAX_TOKENS, SEED_PROMPTS, seed_gpu
from bench.consume_sides import consume_argv
from bench.figures import Figure, Recorder, console_table, ratio
from bench.seed_sides import wait_registered
from bench.services import bench_settings, child_env, tokenmill_argv
from bench.timing import Launched
from devstack.images import PACKAGES
from devstack.processes import free_port
from sglang_sim.runner import SimulatorProcess
from tokenmill import log

console = Console(width=200)

STATUS_LIMIT_S = 2.0
PHASES = ((0.0, 15.0), (15.0, 45.0), (45.0, float("inf")))
METHOD = ("wall clock, `tokenmill status --run R --json` process launch to exit, one at a "
          "time, alternately this checkout and the baseline's, from the launch of 7 workers "
          "and a sink (3 brokers, 7 simulated GPUs, produce of 913,786 prompts under way)")
PLACEMENT = {
    "shared": "the services, simulators and looks in the benchmark's one session",
    "own": "each service, simulator and look in its own session (systemd units, a terminal)",
}


class Look(msgspec.Struct):
    side: str  # "tokenmill" (this checkout) or "baseline"
    at: float  # seconds after the fleet's launch
    s: float  # wall seconds, process launch to exit
    ok: bool  # exited 0


def compile_tree(tree: Path) -> None:
    """Both sides as installed: a wheel's install compiles its modules, and
    with PYTHONDONTWRITEBYTECODE (set on this machine) a checkout whose
    modules are not compiled compiles every one at every look."""
    packages = [str(tree / name) for name in PACKAGES if (tree / name).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *packages],
                   check=True, stdout=subprocess.DEVNULL)


def look(tree: Path, run_id: str, env: dict[str, str], own_session: bool) -> tuple[float, bool]:
    """One `status` from `tree`: (wall seconds, exited 0)."""
    argv = [sys.executable, "-m", "tokenmill.cli", "status", "--run", run_id, "--json"]
    started = time.monotonic()
    done = subprocess.run(argv, env={**env, "PYTHONPATH": str(tree)}, cwd=tree,
                          capture_output=True, timeout=120, start_new_session=own_session)
    return time.monotonic() - started, done.returncode == 0


def by_phase(looks: list[Look], side: str) -> dict[str, dict[str, float]]:
    out = {}
    for low, high in PHASES:
        seconds = [x.s for x in looks if x.side == side and low <= x.at < high]
        if seconds:
            out[f"{low:.0f}-{'' if high == float('inf') else f'{high:.0f}'} s"] = {
                "looks": len(seconds), "max_s": round(max(seconds), 2),
                "median_s": round(statistics.median(seconds), 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-tree", type=Path, required=True,
                        help="another checkout of tokenmill (its status is the baseline)")
    parser.add_argument("--seconds", type=float, default=100.0)
    parser.add_argument("--sessions", choices=sorted(PLACEMENT), default="shared",
                        help="the scheduler's placement of the processes (see above)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the seed's dataset is generated (reused when already there)")
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()
    baseline_tree = args.baseline_tree.resolve()
    if not (baseline_tree / "ops" / "status.py").is_file():
        parser.error(f"--baseline-tree {baseline_tree}: not a tokenmill checkout")
    commit = subprocess.run(["git", "-C", str(baseline_tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    baseline_name = f"status at {commit or baseline_tree.name}"
    own = args.sessions == "own"
    method = f"{METHOD}; {PLACEMENT[args.sessions]}"
    named = "" if args.sessions == "shared" else ", each process in its own session"
    os.environ["PYTHONPATH"] = str(ROOT)  # the simulators and services run this checkout
    for tree in (ROOT, baseline_tree):
        compile_tree(tree)
    log.configure("warning", "console")
    recorder = Recorder("bench_status_launch")
    work = Path(tempfile.mkdtemp(prefix="bench-status-"))
    files = generate(args.data_dir or work / "data", SEED_PROMPTS)
    looks: list[Look] = []
    with bench_settings(kafka_heap="1g", brokers=3) as settings:
        env = child_env(settings)
        sims = [SimulatorProcess(seed_gpu(50.0, 32), port=free_port(), own_session=own)
                for _ in range(GPUS)]
        procs: list[Launched] = []
        run_id = f"st{os.urandom(3).hex()}"
        try:
            urls = [sim.start() for sim in sims]
            producer = Launched(tokenmill_argv("produce", *map(str, files), "--run", run_id,
                                               "--gpus", str(GPUS), "--max-tokens",
                                               str(MAX_TOKENS), "--model", "sim"),
                                env=env, log=work / "producer.log", cwd=ROOT, own_session=own)
            procs.append(producer)
            wait_registered(settings, run_id, producer)
            for i, url in enumerate(urls):
                procs.append(Launched(consume_argv(run_id, url, f"w{i}", "--concurrency",
                                                   str(CONCURRENCY)),
                                      env=env, log=work / f"worker{i}.log", cwd=ROOT,
                                      own_session=own))
            procs.append(Launched(tokenmill_argv("sink", "--run", run_id, "--instance", "s0"),
                                  env=env, log=work / "sink.log", cwd=ROOT, own_session=own))
            launched = time.monotonic()
            while time.monotonic() - launched < args.seconds:
                side, tree = ((("baseline", baseline_tree), ("tokenmill", ROOT))[len(looks) % 2])
                at = time.monotonic() - launched
                seconds, ok = look(tree, run_id, env, own)
                looks.append(Look(side, round(at, 2), round(seconds, 3), ok))
                console.print(f"{at:6.1f} s  {side:<9} {seconds:5.2f} s{'' if ok else ' FAILED'}")
        finally:
            for proc in procs:
                proc.proc.kill()
            for sim in sims:
                sim.kill()
    failed = [x for x in looks if not x.ok]
    ours = [x.s for x in looks if x.side == "tokenmill"]
    theirs = [x.s for x in looks if x.side == "baseline"]
    details = {"looks": looks, "phases": {"tokenmill": by_phase(looks, "tokenmill"),
                                          "baseline": by_phase(looks, "baseline")},
               "failed": len(failed), "baseline_tree": str(baseline_tree),
               "baseline_commit": commit, "sessions": args.sessions,
               "seconds": args.seconds}
    figures = [
        Figure(name=f"status at a seed-size launch, slowest look{named}", unit="s",
               tokenmill=round(max(ours), 3), baseline=round(max(theirs), 3),
               baseline_name=baseline_name, ratio=ratio(max(ours), max(theirs)),
               target=f"< {STATUS_LIMIT_S:g} s", met=max(ours) < STATUS_LIMIT_S and not failed,
               method=method, details=details),
        Figure(name=f"status at a seed-size launch, median look{named}", unit="s",
               tokenmill=round(statistics.median(ours), 3),
               baseline=round(statistics.median(theirs), 3),
               baseline_name=baseline_name,
               ratio=ratio(statistics.median(ours), statistics.median(theirs)),
               target="<= 1 x baseline", met=statistics.median(ours) <= statistics.median(theirs),
               method=method),
    ]
    if args.out:
        recorder.write(args.out, figures)
    console.print(console_table("bench_status_launch", figures))
    console.print(f"logs: {work}")


if __name__ == "__main__":
    main()
