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
state, start-up and tail left out) is kept in the JSON details for
diagnosis; it is not what the verdicts use.

    python bench/bench_consumer.py [--prompts 20000] [--saturation-prompts 3000]
                                   [--only a,b,c] [--out bench/results/consumer.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.consume_sides import Side, plain_loop, setup_run, tokenmill_side
from bench.figures import Figure, Recorder, console_table, ratio
from bench.services import bench_settings
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


class TokenRate:
    """Samples the simulator's sglang:generation_tokens_total while a run goes
    on: the server's own view of throughput, the same for every client."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith("sglang:generation_tokens_total"):
                        self.samples.append((time.monotonic(), float(line.rsplit(" ", 1)[1])))
            time.sleep(0.25)

    def __enter__(self) -> TokenRate:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def steady_rate(self) -> float:
        """Tokens/s over the middle 80% of the active window (first to last
        token): diagnosis only, start-up and tail left out."""
        active = [s for s in self.samples if s[1] > self.samples[0][1]]
        last_value = self.samples[-1][1]
        active = [s for s in active if s[1] < last_value] or active
        t0, t1 = active[0][0], active[-1][0]
        lo, hi = t0 + (t1 - t0) * 0.1, t1 - (t1 - t0) * 0.1
        window = [s for s in active if lo <= s[0] <= hi]
        if len(window) < 2:
            return float("nan")
        return round((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]))


def measured_tokenmill(settings: Settings, config: SimulatorConfig, n: int, partitions: int,
                       max_tokens: int, work: Path, *flags: str) -> tuple[Side, float]:
    with SimulatorProcess(config) as sim, TokenRate(sim.base_url) as meter:
        run = setup_run(settings, n, partitions, max_tokens)
        side = tokenmill_side(settings, run, [sim.base_url], work, *WORKER_FLAGS, *flags)
    if side.answers != n:
        raise RuntimeError(f"{side.answers} committed results for {n} prompts")
    return side, meter.steady_rate()


def measured_plain_loop(config: SimulatorConfig, n: int, concurrency: int, max_tokens: int,
                        work: Path) -> tuple[Side, float]:
    with SimulatorProcess(config) as sim, TokenRate(sim.base_url) as meter:
        side = plain_loop([sim.base_url], n, concurrency,
                          GenerationSettings(model="sim", max_tokens=max_tokens), work)
    return side, meter.steady_rate()


def bench_a(settings: Settings, n: int, work: Path) -> Figure:
    concurrency = 256
    ours, _ = measured_tokenmill(settings, ZERO, n, 8, 64, work, "--concurrency",
                                 str(concurrency))
    base, _ = measured_plain_loop(ZERO, n, concurrency, 64, work)
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


def saturation_baseline(n: int, work: Path) -> tuple[Side, float]:
    return measured_plain_loop(SEED_GPU, n, SATURATION_CONCURRENCY, 8192, work)


def tokens_figure(name: str, ours: Side, ours_steady: float, base: Side, base_steady: float,
                  target: float, extra: dict[str, object]) -> Figure:
    rate, base_rate = ours.completion_tokens / ours.wall_s, base.completion_tokens / base.wall_s
    share = rate / base_rate
    return Figure(
        name=name, unit="tok/s", tokenmill=round(rate), baseline=round(base_rate),
        baseline_name=f"plain asyncio loop, concurrency {SATURATION_CONCURRENCY}",
        ratio=ratio(rate, base_rate), target=f">= {target} x baseline", met=share >= target,
        method=METHOD + "; tokens = completion tokens of every answer",
        tokenmill_wall_s=round(ours.wall_s, 2), baseline_wall_s=round(base.wall_s, 2),
        tokenmill_cpu_s=round(ours.cpu_s, 1), baseline_cpu_s=round(base.cpu_s, 1),
        details={"tokenmill_tokens": ours.completion_tokens,
                 "baseline_tokens": base.completion_tokens,
                 "steady_state_tok_s_tokenmill": ours_steady,
                 "steady_state_tok_s_baseline": base_steady,
                 **({"notes": ours.notes} if ours.notes else {}),
                 "steady_state_method": "server's sglang:generation_tokens_total, middle 80% "
                                        "of the active window (diagnosis, not the verdict)",
                 **extra})


def bench_b(settings: Settings, n: int, work: Path, base: tuple[Side, float]) -> Figure:
    ours, steady = measured_tokenmill(settings, SEED_GPU, n, 4, 8192, work, "--concurrency",
                                      str(SATURATION_CONCURRENCY))
    return tokens_figure(
        f"consumer (b) saturation, seed-run GPU x{TIME_SCALE:.0f} time, {n:,} prompts",
        ours, steady, base[0], base[1], 0.97, {"concurrency": SATURATION_CONCURRENCY})


def bench_c(settings: Settings, n: int, work: Path, base: tuple[Side, float]) -> Figure:
    ours, steady = measured_tokenmill(settings, SEED_GPU, n, 4, 8192, work, "--concurrency",
                                      "auto")
    capacity = SEED_GPU.max_total_tok_s * TIME_SCALE
    return tokens_figure(
        f"consumer (c) --concurrency auto from cold start, {n:,} prompts",
        ours, steady, base[0], base[1], 0.95,
        {"configured_capacity_tok_s": capacity,
         "share_of_capacity": round(ours.completion_tokens / ours.wall_s / capacity, 3)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20_000, help="prompts for (a)")
    parser.add_argument("--saturation-prompts", type=int, default=3_000,
                        help="prompts for (b), (c)")
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
            base = saturation_baseline(args.saturation_prompts, work)
            if "b" in only:
                figures.append(bench_b(settings, args.saturation_prompts, work, base))
            if "c" in only:
                figures.append(bench_c(settings, args.saturation_prompts, work, base))
    recorder.write(args.out, figures)
    console.print(console_table("tokenmill consumer benchmarks (wall clock)", figures))
    console.print(f"logs: {work}" + (f"; raw results: {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
