"""Fleet scheduling: does a mixed fleet finish together, and how fast does a
stopping worker hand over?

Each case runs on three simulated GPUs (`tokenmill sim-sglang` processes,
--time-scale 10, --max-running-requests 32), 1,200 prompts, max_tokens 4096,
32 requests in flight per worker. Both sides are timed the same way
(bench/consume_sides.py), each in its own processes: wall clock from launch
to the last committed result (tokenmill: start-up, group join and final
commit included) or to the last answer (the baseline); CPU seconds of each
side's processes are reported apart.

(a) mixed fleet, decode rates 60 / 60 / 20 tok/s: tokenmill's makespan (3
    `tokenmill consume` processes, one run of 12 partitions) divided by the
    seed's plain asyncio loop with one shared queue over the same three
    servers (target <= 1.10);
(b) the same on three equal GPUs, 60 / 60 / 60 (target <= 1.02);
(c) SIGTERM of one of three workers mid-run: seconds until every partition it
    owned is owned by another worker's group member (target <= 5).

    python bench/bench_fleet.py [--prompts 1200] [--only a,b,c] [--pairs 1]
                                [--out bench/results/fleet.json]

On 1,200 prompts (about a minute) the three workers' start-up is a large
share of the makespan; `--only b --prompts 6000 --pairs 3` runs the equal
fleet long enough that it is not, and reports each side's fixed cost (wall
clock the servers did not generate) and the servers' steady-state rate apart.

Kafka comes from TOKENMILL_BOOTSTRAP_SERVERS (and the other TOKENMILL_* variables) if
set, else a private dev stack whose broker has deploy/kafka/server.properties' KIP-848
settings.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.consume_sides import consume_argv, plain_loop, setup_run, tokenmill_side
from bench.figures import Figure, Recorder, console_table, median_paired_ratio, ratio
from bench.services import bench_settings, child_env
from bench.timing import Launched
from bench.token_rate import Measured, measured, split_details
from devstack.processes import free_port
from schemas import GenerationSettings
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tokenmill import log
from tokenmill.kafka import clients, groups, topics
from tokenmill.settings import Settings

console = Console(width=200)

TIME_SCALE = 10.0
CONCURRENCY = 32
MAX_TOKENS = 4096
PARTITIONS_PER_GPU = 4
WORKER_FLAGS = ("--concurrency", str(CONCURRENCY), "--session-timeout", "6")
METHOD = ("wall clock, first launch to the group's commit of the last prompt (3 `tokenmill "
          "consume` processes) / launch to the last answer (plain loop, its own process, one "
          "shared queue over the 3 servers, same request bodies)")


def gpu(decode_rate: float) -> SimulatorConfig:
    return SimulatorConfig(time_scale=TIME_SCALE, max_running_requests=CONCURRENCY,
                           decode_rate=decode_rate, prefill_rate=0)


def makespan_case(settings: Settings, name: str, rates: list[float], n: int, target: float,
                  work: Path, pairs: int = 1) -> Figure:
    """`pairs` rounds of both sides on the same servers, the order alternating
    round by round (baseline first, then last): the verdict is the median of
    the paired makespan ratios."""
    sims = [SimulatorProcess(gpu(rate), port=free_port()) for rate in rates]
    urls = [sim.start() for sim in sims]
    generation = GenerationSettings(model="sim", max_tokens=MAX_TOKENS)
    ours: list[Measured] = []
    base: list[Measured] = []
    try:
        for i in range(pairs):
            for which in (("base", "ours") if i % 2 == 0 else ("ours", "base")):
                if which == "base":
                    base.append(measured(urls, partial(plain_loop, urls, n, CONCURRENCY,
                                                      generation, work)))
                    done = base[-1]
                else:
                    run = setup_run(settings, n, PARTITIONS_PER_GPU * len(urls), MAX_TOKENS,
                                    gpus=len(urls))
                    ours.append(measured(urls, partial(tokenmill_side, settings, run, urls,
                                                      work, *WORKER_FLAGS)))
                    done = ours[-1]
                    if done.side.answers != n:
                        raise RuntimeError(f"{done.side.answers} committed results for "
                                           f"{n} prompts")
                console.print(f"  {name}: pair {i + 1}/{pairs}, "
                              f"{'shared-queue loop' if which == 'base' else 'tokenmill'} "
                              f"{done.side.wall_s:.1f}s (fixed cost {done.fixed_s:.1f}s)")
    finally:
        for sim in sims:
            sim.terminate()
    share = median_paired_ratio([o.side.wall_s for o in ours], [b.side.wall_s for b in base])
    return Figure(name=f"{name}, {n:,} prompts, makespan", unit="s",
                  tokenmill=round(statistics.median(o.side.wall_s for o in ours), 2),
                  baseline=round(statistics.median(b.side.wall_s for b in base), 2),
                  baseline_name="plain asyncio loop, one shared queue over the 3 servers",
                  ratio=share, target=f"<= {target} x baseline", met=share <= target,
                  method=METHOD + (f"; {pairs} alternating pairs, the median of the paired "
                                   "ratios" if pairs > 1 else ""),
                  tokenmill_wall_s=round(statistics.median(o.side.wall_s for o in ours), 2),
                  baseline_wall_s=round(statistics.median(b.side.wall_s for b in base), 2),
                  tokenmill_cpu_s=round(statistics.median(o.side.cpu_s for o in ours), 1),
                  baseline_cpu_s=round(statistics.median(b.side.cpu_s for b in base), 1),
                  details={"decode_rates": rates, "time_scale": TIME_SCALE,
                           "partitions": PARTITIONS_PER_GPU * len(urls),
                           "worker_flags": " ".join(WORKER_FLAGS),
                           "pairs": pairs,
                           "paired_ratios": [ratio(o.side.wall_s, b.side.wall_s)
                                             for o, b in zip(ours, base, strict=True)],
                           **split_details(
                               ours, base,
                               steady_method="each server's sglang:generation_tokens_total "
                                             "over its middle 80% (first to last token), "
                                             "summed over the servers",
                               fixed_method="wall clock less the fleet's active window "
                                            "(first token on any server to the last)"),
                           **({"notes": [n for o in ours for n in o.side.notes]}
                              if any(o.side.notes for o in ours) else {})})


def handover_case(settings: Settings, n: int, work: Path) -> Figure:
    """SIGTERM one of three workers once every worker owns partitions;
    seconds until none of its partitions is without another owner."""
    sims = [SimulatorProcess(gpu(60.0), port=free_port()) for _ in range(3)]
    urls = [sim.start() for sim in sims]
    admin = clients.admin(settings)
    procs: list[Launched] = []
    try:
        run = setup_run(settings, n, PARTITIONS_PER_GPU * 3, MAX_TOKENS, gpus=3)
        spec = run.spec
        group, topic = topics.generate_group(spec.run_id), topics.prompts_topic(spec.run_id)
        env = child_env(settings)
        procs = [Launched(consume_argv(spec.run_id, url, f"w{i}", *WORKER_FLAGS), env=env,
                          log=work / f"{spec.run_id}-w{i}.log", cwd=ROOT)
                 for i, url in enumerate(urls)]

        def owners() -> dict[int, str]:
            state = groups.describe(admin, group, topic)
            return {p: m.client_id.rsplit("#", 1)[0] for m in state.members for p in m.partitions}

        deadline = time.monotonic() + 120
        while len(set(owners().values())) < 3 or len(owners()) < spec.partitions:
            if time.monotonic() > deadline:
                raise RuntimeError("the three workers never all owned partitions")
            time.sleep(0.2)
        time.sleep(5)  # steady state, requests in flight
        had = {p for p, w in owners().items() if w == "w2"}
        stopped = time.monotonic()
        procs[2].proc.send_signal(signal.SIGTERM)
        while True:
            now = owners()
            if all(now.get(p) not in (None, "w2") for p in had):
                seconds = time.monotonic() - stopped
                break
            if time.monotonic() - stopped > 120:
                raise RuntimeError("partitions never handed over")
            time.sleep(0.05)
        procs[2].wait(60)
        for p in procs[:2]:
            p.proc.send_signal(signal.SIGTERM)
            p.wait(120)
    finally:
        for p in procs:
            p.kill()
        for sim in sims:
            sim.terminate()
    return Figure(name="fleet (c) SIGTERM hand-over", unit="s", tokenmill=round(seconds, 2),
                  baseline=None, baseline_name=None, ratio=None, target="<= 5 s",
                  met=seconds <= 5,
                  method=f"wall clock, SIGTERM to every one of the worker's {len(had)} partitions "
                         "owned by another worker (admin describe, 50 ms polls)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1200)
    parser.add_argument("--only", default="a,b,c")
    parser.add_argument("--pairs", type=int, default=1,
                        help="(a), (b): rounds of both sides, alternating which goes first; "
                             "the verdict is the median of the paired ratios")
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    log.configure("warning", "console")
    recorder = Recorder("bench_fleet")
    figures: list[Figure] = []
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    with bench_settings() as settings:
        if "a" in only:
            figures.append(makespan_case(settings, "fleet (a) mixed fleet 60/60/20 tok/s",
                                         [60, 60, 20], args.prompts, 1.10, work, args.pairs))
        if "b" in only:
            figures.append(makespan_case(settings, "fleet (b) equal fleet 60/60/60 tok/s",
                                         [60, 60, 60], args.prompts, 1.02, work, args.pairs))
        if "c" in only:
            figures.append(handover_case(settings, args.prompts * 2, work))
    recorder.write(args.out, figures)
    console.print(console_table("bench_fleet (wall clock)", figures))
    console.print(f"worker logs: {work}" + (f"; raw results: {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
