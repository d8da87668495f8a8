"""Consumer benchmarks: `tokenmill consume` next to the seed run's plain
asyncio loop, against simulators in their own processes.

Both sides are timed the same way (bench/consume_sides.py): wall clock from
the launch of the process to the last committed result (tokenmill: start-up,
imports, group join and the final transaction included) or the last answer
(the plain loop, bench/plain_loop.py, sending the same request bodies). CPU
seconds of each side's processes are reported in their own column.

(a) EOS overhead: completions/s through one consumer at zero delay
    (target >= 1,500/s: a GPU does 1-10/s, the pipeline must never be the
    bottleneck), next to the plain loop at the same concurrency.
(b) saturation: generated tokens/s of tokenmill / the plain loop at the same
    concurrency, against a simulator with the seed run's capacity (64
    running requests, ~3,600 tok/s per GPU), time-scaled (target >= 0.97).
(c) --concurrency auto from a cold start: generated tokens/s / the plain
    loop's at the hand-picked concurrency of (b) (target >= 0.95); the
    share of the simulator's configured capacity is in the JSON details.

The server's own token counter over the middle 80% of each run (steady
state, start-up and tail left out) is in the JSON details, as the
steady-state ratio and each side's fixed cost; the verdicts use the wall
clock.

    python bench/bench_consumer.py [--prompts 20000] [--saturation-prompts 3000]
                                   [--pairs 1] [--only a,b,c] [--out bench/results/consumer.json]

On a short run, start-up is a large share of the wall clock; `--pairs 3
--saturation-prompts 12000` runs (b) and (c) long enough that each side's
fixed cost (wall clock the server was not generating, in the details) is
under 2% of it, three alternating rounds, and reports the median of the
paired ratios, with the steady-state ratio beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.consume_sides import plain_loop, setup_run, tokenmill_side
from bench.figures import Figure, Recorder, console_table, median_paired_ratio, ratio
from bench.services import bench_settings
from bench.token_rate import Measured, measured, split_details
from schemas import GenerationSettings
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tokenmill import log
from tokenmill.settings import Settings

console = Console(width=200)

ZERO = SimulatorConfig(zero_delay=True, length_median=30, length_sigma=0.3, length_max=80)
# The seed run: 64 running requests per GPU, ~3,600 tok/s per GPU, ~2,400-token answers.
TIME_SCALE = 40.0
SEED_GPU = SimulatorConfig(max_running_requests=64, decode_rate=60.0, max_total_tok_s=3600.0,
                           prefill_rate=0, time_scale=TIME_SCALE, speculative_accept_length=3.0)
SATURATION_CONCURRENCY = 72
WORKER_FLAGS = ("--commit-interval", "1.0", "--retry-base", "0.1")
METHOD = ("wall clock, process launch to last committed result (tokenmill: start-up, group "
          "join, final commit) / to last answer (plain loop, its own process, same request "
          "bodies)")


def measured_tokenmill(settings: Settings, config: SimulatorConfig, n: int, partitions: int,
                       max_tokens: int, work: Path, *flags: str) -> Measured:
    with SimulatorProcess(config) as sim:
        run = setup_run(settings, n, partitions, max_tokens)
        m = measured([sim.base_url], partial(tokenmill_side, settings, run, [sim.base_url],
                                             work, *WORKER_FLAGS, *flags))
    if m.side.answers != n:
        raise RuntimeError(f"{m.side.answers} committed results for {n} prompts")
    return m


def measured_plain_loop(config: SimulatorConfig, n: int, concurrency: int, max_tokens: int,
                        work: Path) -> Measured:
    with SimulatorProcess(config) as sim:
        return measured([sim.base_url], partial(
            plain_loop, [sim.base_url], n, concurrency,
            GenerationSettings(model="sim", max_tokens=max_tokens), work))


def bench_a(settings: Settings, n: int, work: Path) -> Figure:
    concurrency = 256
    ours = measured_tokenmill(settings, ZERO, n, 8, 64, work, "--concurrency",
                              str(concurrency)).side
    base = measured_plain_loop(ZERO, n, concurrency, 64, work).side
    rate, base_rate = n / ours.wall_s, n / base.wall_s
    return Figure(
        name=f"consumer (a) EOS overhead, zero delay, {n:,} prompts",
        unit="completions/s", tokenmill=round(rate), baseline=round(base_rate),
        baseline_name=f"plain asyncio loop, concurrency {concurrency}",
        ratio=ratio(rate, base_rate), target=">= 1,500 completions/s", met=rate >= 1500,
        method=METHOD,
        tokenmill_wall_s=round(ours.wall_s, 2), baseline_wall_s=round(base.wall_s, 2),
        tokenmill_cpu_s=round(ours.cpu_s, 1), baseline_cpu_s=round(base.cpu_s, 1),
        details={"partitions": 8, "concurrency": concurrency,
                 "worker_flags": " ".join(WORKER_FLAGS),
                 **({"notes": ours.notes} if ours.notes else {})})


def saturation_baseline(n: int, work: Path) -> Measured:
    return measured_plain_loop(SEED_GPU, n, SATURATION_CONCURRENCY, 8192, work)


def saturation_tokenmill(settings: Settings, n: int, work: Path, concurrency: str) -> Measured:
    return measured_tokenmill(settings, SEED_GPU, n, 4, 8192, work, "--concurrency", concurrency)


def tokens_figure(name: str, ours: list[Measured], base: list[Measured], target: float,
                  extra: dict[str, object]) -> Figure:
    """One run a side, or pairs (ours[i] ran beside base[i]): the verdict is
    the median of the paired ratios of generated tokens/s, wall clock; the
    steady state (the server's own rate, middle 80%) and each side's fixed
    cost (wall clock the server did not generate) are reported apart."""
    share = median_paired_ratio([m.tok_s for m in ours], [m.tok_s for m in base])
    rate = statistics.median(m.tok_s for m in ours)
    base_rate = statistics.median(m.tok_s for m in base)
    return Figure(
        name=name, unit="tok/s", tokenmill=round(rate), baseline=round(base_rate),
        baseline_name=f"plain asyncio loop, concurrency {SATURATION_CONCURRENCY}",
        ratio=share, target=f">= {target} x baseline", met=share >= target,
        method=METHOD + "; tokens = completion tokens of every answer"
               + (f"; {len(ours)} alternating pairs, the median of the paired ratios"
                  if len(ours) > 1 else ""),
        tokenmill_wall_s=round(statistics.median(m.side.wall_s for m in ours), 2),
        baseline_wall_s=round(statistics.median(m.side.wall_s for m in base), 2),
        tokenmill_cpu_s=round(statistics.median(m.side.cpu_s for m in ours), 1),
        baseline_cpu_s=round(statistics.median(m.side.cpu_s for m in base), 1),
        details={"pairs": len(ours),
                 "paired_ratios": [ratio(o.tok_s, b.tok_s) for o, b in zip(ours, base)],
                 **split_details(
                     ours, base,
                     steady_method="server's sglang:generation_tokens_total, middle 80% of "
                                   "the active window (first to last token)",
                     fixed_method="wall clock less the server's active window"),
                 **({"notes": [n for m in ours for n in m.side.notes]}
                    if any(m.side.notes for m in ours) else {}),
                 **extra})


def saturation_pairs(settings: Settings, n: int, work: Path, pairs: int,
                     only: set[str]) -> dict[str, list[Measured]]:
    """`pairs` rounds of the baseline, (b) and (c), the order alternating
    round by round (baseline first, then last), so drift on the machine
    falls on both sides of a pair alike."""
    runs: dict[str, list[Measured]] = {"base": [], "b": [], "c": []}
    order = ["base", *sorted(only & {"b", "c"})]
    for i in range(pairs):
        for which in (order if i % 2 == 0 else order[::-1]):
            if which == "base":
                runs["base"].append(saturation_baseline(n, work))
            else:
                concurrency = str(SATURATION_CONCURRENCY) if which == "b" else "auto"
                runs[which].append(saturation_tokenmill(settings, n, work, concurrency))
            console.print(f"pair {i + 1}/{pairs}: {which} done "
                          f"({runs[which][-1].side.wall_s:.1f} s)")
    return runs


def bench_b(n: int, runs: dict[str, list[Measured]]) -> Figure:
    return tokens_figure(
        f"consumer (b) saturation, seed-run GPU x{TIME_SCALE:.0f} time, {n:,} prompts",
        runs["b"], runs["base"], 0.97, {"concurrency": SATURATION_CONCURRENCY})


def bench_c(n: int, runs: dict[str, list[Measured]]) -> Figure:
    capacity = SEED_GPU.max_total_tok_s * TIME_SCALE
    return tokens_figure(
        f"consumer (c) --concurrency auto from cold start, {n:,} prompts",
        runs["c"], runs["base"], 0.95,
        {"configured_capacity_tok_s": capacity,
         "share_of_capacity": [round(m.tok_s / capacity, 3) for m in runs["c"]]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20_000, help="prompts for (a)")
    parser.add_argument("--saturation-prompts", type=int, default=3_000,
                        help="prompts for (b), (c)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="rounds of (baseline, b, c) for (b), (c), order alternating; "
                             "the verdict is the median of the paired ratios")
    parser.add_argument("--only", default="a,b,c")
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()
    only = set(args.only.split(","))
    log.configure("warning", "console")
    recorder = Recorder("bench_consumer")
    figures: list[Figure] = []
    work = Path(tempfile.mkdtemp(prefix="bench-consumer-"))
    with bench_settings() as settings:
        if "a" in only:
            figures.append(bench_a(settings, args.prompts, work))
            console.print(console_table("consumer", figures[-1:]))
        if only & {"b", "c"}:
            runs = saturation_pairs(settings, args.saturation_prompts, work, args.pairs, only)
            if "b" in only:
                figures.append(bench_b(args.saturation_prompts, runs))
            if "c" in only:
                figures.append(bench_c(args.saturation_prompts, runs))
    recorder.write(args.out, figures)
    console.print(console_table("tokenmill consumer benchmarks (wall clock)", figures))
    console.print(f"logs: {work}" + (f"; raw results: {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
