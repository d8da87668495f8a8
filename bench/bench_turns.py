"""regenerate-turns benchmark: committed turns/s through one worker at zero
delay, next to single-turn completions/s in the same run (target: at least
0.9 of it). A turn costs a transaction round trip more than a completion (the
next turn is visible only once committed), so enough conversations must be
in flight to keep the worker busy while their next turns wait.

Both sides run `--repeat` times, alternating (the figure: each side's median
run). Both are timed the same way: wall clock from the launch of
`tokenmill consume` to the commit whose progress counters count the last
result (results and counters commit in one transaction), polled every 50 ms.

    python bench/bench_turns.py [--prompts 20000] [--conversations 5000] [--turns 4] [--repeat 3]
                                [--out bench/results/turns.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.consume_sides import Side, setup_run, tokenmill_side
from bench.figures import Figure, Recorder, console_table, ratio
from bench.services import bench_settings
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tokenmill import log, progress
from tokenmill.settings import Settings

console = Console(width=200)

ZERO = SimulatorConfig(zero_delay=True, length_median=30, length_sigma=0.3, length_max=80)
CONCURRENCY = 256
PARTITIONS = 8
# No fleet balancing on either side: a regenerate-turns run never splits into
# capacity-weighted slots (consumer/balancing.py), so the single-turn side runs
# the same one-slot worker and the ratio is the cost of turns alone.
WORKER_FLAGS = ("--commit-interval", "1.0", "--retry-base", "0.1", "--concurrency",
                str(CONCURRENCY), "--no-fleet-balancing")
METHOD = ("wall clock, launch of one `tokenmill consume` to the commit that counts the last "
          "result (both sides); turns = generated steps committed")


def measured(settings: Settings, n: int, turns: int, work: Path) -> tuple[Side, int]:
    """One worker through n prompts (turns > 1: conversations of that many
    user turns); the side and the turns its counters committed."""
    with SimulatorProcess(ZERO) as sim:
        # max_tokens above the longest answer: no conversation ends early on `length`.
        run = setup_run(settings, n, PARTITIONS, 128, turns=turns)
        side = tokenmill_side(settings, run, [sim.base_url], work, *WORKER_FLAGS,
                              by_progress=True)
    if side.answers != n:
        raise RuntimeError(f"{side.answers} committed results for {n} prompts")
    committed_turns = int(progress.read_run_progress(settings, run.spec.run_id)
                          .consumer_total("turns"))
    return side, committed_turns


def median_side(sides: list[Side], work: int) -> Side:
    """The run with the median rate (`work`: results each run committed)."""
    return sorted(sides, key=lambda side: work / side.wall_s)[len(sides) // 2]


def bench_turns(settings: Settings, prompts: int, conversations: int, turns: int,
                repeat: int, work: Path) -> Figure:
    """Single-turn and regenerate-turns runs alternate, `repeat` times each
    (the machine is shared: one pair alone swung 0.6-1.5); the figure is
    each side's median run."""
    singles, multis = [], []
    for _ in range(repeat):
        singles.append(measured(settings, prompts, 1, work)[0])
        multi, committed_turns = measured(settings, conversations, turns, work)
        if committed_turns != conversations * turns:
            raise RuntimeError(f"{committed_turns} turns committed, "
                               f"{conversations * turns} wanted")
        multis.append(multi)
    committed_turns = conversations * turns
    single, multi = median_side(singles, prompts), median_side(multis, committed_turns)
    rate, base_rate = committed_turns / multi.wall_s, prompts / single.wall_s
    return Figure(
        name=f"regenerate-turns, zero delay, one worker, {conversations:,} conversations x "
             f"{turns} turns",
        unit="turns/s", tokenmill=round(rate), baseline=round(base_rate),
        baseline_name=f"single-turn completions/s, {prompts:,} prompts, same worker flags",
        ratio=ratio(rate, base_rate), target=">= 0.9 x single-turn completions/s",
        met=rate >= 0.9 * base_rate, method=METHOD,
        tokenmill_wall_s=round(multi.wall_s, 2), baseline_wall_s=round(single.wall_s, 2),
        tokenmill_cpu_s=round(multi.cpu_s, 1), baseline_cpu_s=round(single.cpu_s, 1),
        details={"partitions": PARTITIONS, "concurrency": CONCURRENCY,
                 "worker_flags": " ".join(WORKER_FLAGS), "turns": committed_turns,
                 "runs_turns_per_s": [round(committed_turns / m.wall_s) for m in multis],
                 "runs_completions_per_s": [round(prompts / x.wall_s) for x in singles],
                 **({"notes": multi.notes + single.notes} if multi.notes or single.notes
                    else {})})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20_000, help="single-turn prompts")
    parser.add_argument("--conversations", type=int, default=5_000)
    parser.add_argument("--turns", type=int, default=4, help="user turns per conversation")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side (medians)")
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()
    log.configure("warning", "console")
    recorder = Recorder("bench_turns")
    work = Path(tempfile.mkdtemp(prefix="bench-turns-"))
    with bench_settings() as settings:
        figures = [bench_turns(settings, args.prompts, args.conversations, args.turns, args.repeat,
                               work)]
    recorder.write(args.out, figures)
    console.print(console_table("tokenmill regenerate-turns benchmark (wall clock)", figures))
    console.print(f"logs: {work}" + (f"; raw results: {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
