"""The seed's job at its real size on this machine (issue 27): does the
pipeline ever make a GPU wait, and does anything grow with the run?

913,786 prompts with the seed's mix (producer/synthetic.py's proportions:
plain, system-prompt, multi-turn, tools; ShareGPT, OpenAI, Hermes, Alpaca,
plain prompts; five JSONL files with the tool prompts in the last one, as in
the seed), published by `tokenmill produce --gpus 7 --max-tokens 4096`;
seven `tokenmill sim-sglang` GPUs, seven `tokenmill consume` workers
(`--concurrency 72`), one `tokenmill sink` (batches of 500), three Kafka
brokers and an S3 server (a private `dev up --brokers 3` stack). The
baseline, in the same invocation and against the same seven servers: the
seed's design, one shared-queue asyncio loop (bench/plain_loop.py), the same
72 requests per server, the exact request bodies tokenmill sent, in the
seed's order (tools last), writing batches of 500 answers to the same S3
server. Both sides are timed the same way, wall clock from launch to the
last result durable in S3 (bench/seed_sides.py says how).

What is scaled, and why:

- time: each simulated GPU is the seed's (64 running requests, 3,600
  generated tokens/s, speculative accept length 3, the length model of
  sglang_sim/lengths.py: median 2,228 tokens, about 18% cut at 4,096) run
  `--time-scale` times faster than real time (default 60: the seed's ~25
  hours at 4,096 tokens become ~25 minutes). Kafka, S3 and every tokenmill
  process run in real time, so per wall-clock second they carry 60 times
  the seed's request rate (about 600 prompts/s instead of ~10): a harder
  test of the pipeline than the real run, not an easier one;
- text: ~2 billion generated tokens of real text (several GB through
  Kafka, three replicas, and S3) cannot be carried by two cores in 25
  minutes, so each simulator returns at most `--text-words` (default 32)
  words of reasoning and of content (`--text-words-max`; a tool-call block
  stays whole). `usage.completion_tokens`, `reasoning_tokens`, timing and
  `finish_reason` still describe the full answer (4,096-token cuts are
  `length`), so throughput, busy share and what goes to the DLQ are the
  seed's; the bytes per record are not (about 1.4 KB per S3 line instead of ~12 KB).
  Both sides get the same servers and therefore the same short text;
- nothing else: the prompt count, the mix, the partition count (28), the
  batch size, the concurrency and the number of processes are the seed's.

Figures (`--out`, default bench/results/seed_run.json; PNG plots beside it;
raw samples in <out stem>.samples.json.gz):

- makespan, tokenmill / baseline (target <= 1.02), with tokenmill's fixed
  costs: launch to first request, last result to last commit;
- steady state: each server's busy share (sglang:num_running_reqs / 64,
  sampled every second from its /metrics) over the middle 80% of each
  side's run; the GPU with the lowest tokenmill / baseline ratio is the
  figure (target >= 0.99 for every GPU);
- RSS of each worker and of the sink: end / value at 10% of the run (target
  <= 1.1), with peak, end, slope (MiB/hour after 10%) and CPU seconds per
  1,000 prompts of every process (workers, sink, producer, brokers, S3
  server, simulators, the baseline loop); the producer and the brokers are
  reported but not judged (the producer ends early; a broker's JVM heap is
  sized by -Xmx, not by tokenmill);
- `tokenmill status --json` wall clock (process launch to exit), at 1%,
  50% and 100% of the run and every `--status-every` seconds (target < 2 s
  at every point), and a worker's done-check (`run_done.look`, every
  second, in this process);
- the progress topic's bytes on the brokers' disks: peak in the second
  half of the run / peak in the first half (bounded: target <= 1.5; linear
  growth gives 2), and the registry topic's bytes at the end;
- S3 objects, bytes and listing time; a sink restarted at the end (launch
  to exit with --until-done); lost and duplicated prompts across S3 and the
  DLQ, by id, read with boto3 and kafka-python (target 0).

    python bench/bench_seed_run.py [--prompts 913786] [--time-scale 60] [--text-words 32]
        [--out bench/results/seed_run.json] [--data-dir DIR] [--status-every 60]
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import seed_figures as sf
from bench import seed_plots
from bench.bench_producer import generate
from bench.figures import Figure, Recorder, console_table, ratio
from bench.seed_checks import stored, stream_values, topic_bytes
from bench.seed_sampler import Sampler, Samples
from bench.seed_sides import (
    BaselineRun,
    TokenmillRun,
    run_baseline,
    run_tokenmill,
    seed_order_bodies,
)
from bench.services import bench_settings, child_env, stack_dir, tokenmill_argv
from bench.timing import Launched
from devstack import stack
from devstack.processes import free_port
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tokenmill import log
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

console = Console(width=200)

SEED_PROMPTS = 913_786
GPUS = 7
SLOTS = 64  # the seed's --max-running-requests after tuning
CONCURRENCY = 72  # the seed's final concurrency per server
MAX_TOKENS = 4096
BATCH = 500
STATUS_LIMIT_S = 2.0
JUDGED = ("worker", "sink")  # processes whose RSS is judged (name prefixes)


def seed_gpu(time_scale: float, text_words: int) -> SimulatorConfig:
    """The seed's B200 as bench_consumer.py models it, sped up `time_scale` times."""
    return SimulatorConfig(max_running_requests=SLOTS, decode_rate=60.0, max_total_tok_s=3600.0,
                           prefill_rate=0, speculative_accept_length=3.0,
                           time_scale=time_scale, text_words_max=text_words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=SEED_PROMPTS)
    parser.add_argument("--time-scale", type=float, default=60.0)
    parser.add_argument("--text-words", type=int, default=32,
                        help="words of reasoning and of content each answer carries")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "seed_run.json")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the dataset is generated (reused when already there)")
    parser.add_argument("--status-every", type=float, default=60.0)
    parser.add_argument("--kafka-heap", default="1g")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(ROOT)  # the simulators and tools run this checkout
    log.configure("warning", "console")
    recorder = Recorder("bench_seed_run")
    work = Path(tempfile.mkdtemp(prefix="bench-seed-"))
    data = args.data_dir or work / "data"
    started = time.monotonic()
    files = generate(data, args.prompts)
    console.print(f"dataset: {args.prompts:,} prompts in {data} "
                  f"({time.monotonic() - started:.0f} s)")
    with bench_settings(kafka_heap=args.kafka_heap, brokers=3) as settings:
        measured = measure(settings, files, args, work)
    figures = build_figures(measured, args)
    recorder.write(args.out, figures)
    save_samples(args.out, measured)
    plots(args.out, measured)
    console.print(console_table(f"bench_seed_run, {args.prompts:,} prompts", figures))
    console.print(f"logs: {work}; results: {args.out}")


@dataclass
class Measured:
    total: int
    run_id: str
    tokenmill: TokenmillRun
    baseline: BaselineRun
    samples: Samples
    checks: dict[str, Any]
    config: dict[str, Any]


def measure(settings: Settings, files: list[Path], args: argparse.Namespace,
            work: Path) -> Measured:
    config = seed_gpu(args.time_scale, args.text_words)
    sims = [SimulatorProcess(config, port=free_port()) for _ in range(GPUS)]
    run_id = f"seed{os.urandom(3).hex()}"
    try:
        urls = [sim.start() for sim in sims]
        sampler = Sampler({f"gpu{i}": url for i, url in enumerate(urls)})
        watch_services(sampler, settings, sims, run_id)
        sampler.start()
        tm = run_tokenmill(settings, run_id, files, urls, sampler, total=args.prompts,
                           concurrency=CONCURRENCY, max_tokens=MAX_TOKENS,
                           status_every_s=args.status_every, work=work, timeout_s=6 * 3600)
        console.print(f"tokenmill: {tm.ended_at - tm.launched_at:.1f} s")
        checks = after_tokenmill(settings, tm, work)
        spec = RunRegistry(settings).get(run_id)
        bodies = work / "bodies.jsonl"
        published = seed_order_bodies(settings, run_id, files, bodies, spec.generation)
        checks["published"] = len(published)
        checks.update(loss(settings, run_id, published))
        time.sleep(3)  # the servers idle between the sides
        base = run_baseline(settings, bodies, urls, sampler, concurrency=CONCURRENCY,
                            batch=BATCH, prefix=f"baseline-{run_id}/", work=work)
        console.print(f"baseline: {base.ended_at - base.launched_at:.1f} s")
        sampler.stop()
    finally:
        for sim in sims:
            sim.terminate()
    return Measured(total=args.prompts, run_id=run_id, tokenmill=tm, baseline=base,
                    samples=sampler.samples, checks=checks,
                    config={"simulator": msgspec.to_builtins(config), "gpus": GPUS,
                            "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS,
                            "batch": BATCH, "partitions": GPUS * 4, "brokers": 3})


def watch_services(sampler: Sampler, settings: Settings, sims: list[SimulatorProcess],
                   run_id: str) -> None:
    for i, sim in enumerate(sims):
        sampler.watch(f"sim{i}", sim.pid)
    state = stack.read_state(stack_dir(settings))
    if state is None:  # services from TOKENMILL_* variables: nothing of theirs to sample
        return
    for broker in state.brokers:
        sampler.watch(f"broker{broker.name.rsplit('-', 1)[-1]}", broker.pid)
    sampler.watch("s3", state.s3.pid)
    dirs = sorted(stack_dir(settings).glob("kafka*/data"))
    sampler.gauges["progress_bytes"] = lambda: float(
        topic_bytes(dirs, topics.progress_topic(run_id)))
    sampler.gauges["registry_bytes"] = lambda: float(topic_bytes(dirs, topics.RUNS_TOPIC))


def after_tokenmill(settings: Settings, tm: TokenmillRun, work: Path) -> dict[str, Any]:
    """S3 listing, and a sink restarted on the finished run (launch to exit)."""
    prefix = f"{settings.s3_prefix.strip('/') + '/' if settings.s3_prefix else ''}{tm.run_id}/"
    listed = stored(settings.s3_endpoint_url, str(settings.s3_bucket), prefix, read_ids=False)
    restart = Launched(tokenmill_argv("sink", "--run", tm.run_id, "--until-done",
                                      "--instance", "sink0"),
                       env=child_env(settings), log=work / "sink-restart.log", cwd=ROOT)
    exited = restart.wait(600)
    return {"s3_prefix": prefix, "s3_objects": listed.objects, "s3_bytes": listed.bytes,
            "s3_list_s": round(listed.list_s, 3),
            "sink_restart_s": round(exited.ended_at - restart.launched_at, 2),
            "sink_restart_exit": exited.code}


def loss(settings: Settings, run_id: str, published: list[str]) -> dict[str, Any]:
    """Lost and duplicated prompts across S3 and the DLQ, by id (boto3, kafka-python)."""
    prefix = f"{settings.s3_prefix.strip('/') + '/' if settings.s3_prefix else ''}{run_id}/"
    s3 = stored(settings.s3_endpoint_url, str(settings.s3_bucket), prefix)
    dlq = [msgspec.json.decode(v)["id"]
           for v in stream_values(settings.bootstrap_servers, topics.dlq_topic(run_id))]
    lost, duplicated, unknown = sf.lost_and_duplicated(published, [*s3.ids, *dlq])
    return {"s3_lines": len(s3.ids), "dlq_records": len(dlq), "lost": lost,
            "duplicated": duplicated, "unknown": unknown}


# ---------------------------------------------------------------- figures


def side_windows(m: Measured) -> dict[str, tuple[float, float]]:
    tm, base = m.tokenmill, m.baseline
    return {"tokenmill": (tm.launched_at, tm.ended_at),
            "baseline": (base.launched_at, base.ended_at)}


def busy_shares(m: Measured) -> dict[str, dict[str, float]]:
    """gpu -> side -> busy share over the middle 80% of that side's run."""
    out: dict[str, dict[str, float]] = {}
    for gpu, metrics in sorted(m.samples.gpu.items()):
        out[gpu] = {}
        for side, (t0, t1) in side_windows(m).items():
            lo, hi = sf.middle_window(t0, t1)
            out[gpu][side] = round(sf.busy_share(metrics["running"], SLOTS, lo, hi), 4)
    return out


def fixed_costs(m: Measured) -> dict[str, float | None]:
    """Launch to the first request any server runs (its running-requests
    gauge, sampled every second), each side, and tokenmill's last result
    (the servers' request counters, same sampling) to its end; the
    baseline's own last answer to its last upload is exact (it reports both)."""
    out: dict[str, float | None] = {}
    gpus = m.samples.gpu.values()
    for side, (t0, _) in side_windows(m).items():
        firsts = [t for g in gpus if (t := sf.first_rise(g["running"], t0)) is not None]
        out[f"{side}_launch_to_first_request_s"] = round(min(firsts) - t0, 1) if firsts else None
    t1 = m.tokenmill.ended_at
    lasts = [t for g in gpus
             if (t := sf.last_rise([s for s in g["requests"] if s[0] <= t1 + 2])) is not None]
    out["tokenmill_last_result_to_end_s"] = round(t1 - max(lasts), 1) if lasts else None
    return out


def makespan_figure(m: Measured) -> Figure:
    tm, base = m.tokenmill, m.baseline
    ours, theirs = tm.ended_at - tm.launched_at, base.ended_at - base.launched_at
    share = ratio(ours, theirs)
    cpu = sum(e.cpu_s for e in tm.exits.values())
    costs = fixed_costs(m)
    costs.update(registered_after_s=round(tm.registered_at - tm.launched_at, 1),
                 generation_done_to_persisted_s=round(tm.ended_at - tm.generation_done_at, 1),
                 baseline_last_answer_to_last_upload_s=round(base.ended_at - base.last_answer_at,
                                                             1))
    return Figure(
        name=f"seed run, {m.total:,} prompts, 7 GPUs, makespan", unit="s",
        tokenmill=round(ours, 1), baseline=round(theirs, 1),
        baseline_name="the seed's loop: one shared asyncio queue over the 7 servers, "
                      "batches of 500 to S3",
        ratio=share, target="<= 1.02 x baseline", met=share <= 1.02,
        method="wall clock, launch of `tokenmill produce` (workers and sink at registration) "
               "to the run's committed progress saying every prompt is in S3 or the DLQ (1 s "
               "polls) / launch of the loop to the end of its last S3 upload",
        tokenmill_wall_s=round(ours, 1), baseline_wall_s=round(theirs, 1),
        tokenmill_cpu_s=round(cpu, 1), baseline_cpu_s=round(base.exit.cpu_s, 1),
        details={"fixed_costs": costs, **m.config,
                 **({"notes": tm.notes} if tm.notes else {})})


def busy_figure(m: Measured) -> Figure:
    shares = busy_shares(m)
    ratios = {g: (s["tokenmill"] / s["baseline"] if s["baseline"] else math.nan)
              for g, s in shares.items()}
    worst = min(ratios, key=lambda g: (not math.isnan(ratios[g]), ratios[g]))  # NaN first
    worst_ratio = round(ratios[worst], 3)
    return Figure(
        name=f"seed run, busy share of each GPU, middle 80% (lowest: {worst})",
        unit="busy share", tokenmill=shares[worst]["tokenmill"],
        baseline=shares[worst]["baseline"], baseline_name="the seed's loop, same servers",
        ratio=worst_ratio, target=">= 0.99 x baseline", met=worst_ratio >= 0.99,
        method="mean of sglang:num_running_reqs / 64 over the /metrics samples (every 1 s) "
               "in the middle 80% of each side's wall-clock run, per server",
        details={"per_gpu": shares, "ratios": {g: round(r, 4) for g, r in ratios.items()}})


def process_table(m: Measured) -> dict[str, dict[str, float]]:
    """Per process: peak / end / at-10% RSS (MiB), growth, slope, CPU s per 1,000 prompts."""
    tm, base = m.tokenmill, m.baseline
    t0, t1 = tm.launched_at, tm.ended_at
    at10 = t0 + (t1 - t0) * sf.FLAT_FROM
    out: dict[str, dict[str, float]] = {}
    for name, rss in sorted(m.samples.rss.items()):
        window = (base.launched_at, base.ended_at) if name == "baseline" else (t0, t1)
        kept = [s for s in rss if window[0] <= s[0] <= window[1] + 60]
        if not kept:
            continue
        cpu = [s for s in m.samples.cpu[name] if window[0] <= s[0] <= window[1] + 60]
        cpu_s = tm.exits[name].cpu_s if name in tm.exits else (
            base.exit.cpu_s if name == "baseline" else cpu[-1][1] - cpu[0][1])
        mib = 2**20
        out[name] = {
            "peak_mib": round(max(v for _, v in kept) / mib, 1),
            "end_mib": round(kept[-1][1] / mib, 1),
            "at_10pct_mib": round(sf.value_at(kept, at10) / mib, 1),
            "growth_after_10pct": round(sf.growth(kept, t0, t1), 3),
            "slope_mib_per_hour": round(sf.slope_per_hour(kept, at10) / mib, 1),
            "alive_at_10pct": float(kept[0][0] <= at10 <= kept[-1][0]),
            "cpu_s_per_1000_prompts": round(cpu_s / m.total * 1000, 3),
        }
    return out


def rss_figure(m: Measured, table: dict[str, dict[str, float]]) -> Figure:
    judged = {n: r for n, r in table.items() if n.startswith(JUDGED)}
    worst = max(judged, key=lambda n: judged[n]["growth_after_10pct"])
    growth = judged[worst]["growth_after_10pct"]
    return Figure(
        name=f"seed run, RSS end / RSS at 10% of the run, worst of workers and sink ({worst})",
        unit="x", tokenmill=growth, baseline=None, baseline_name=None, ratio=None,
        target="<= 1.1", met=growth <= 1.1,
        method="/proc/<pid>/statm every 1 s; value at 10% of the wall-clock run (nearest "
               "sample) and last sample before the run was persisted",
        details={"processes": table, "judged": sorted(judged),
                 "not_judged": "producer (ends early), brokers (JVM heap set by -Xmx), S3 "
                               "server, simulators, baseline loop"})


def at_marks(probes: list[Any]) -> dict[str, float]:
    return {label: round(p.seconds, 3) for p in probes for label in p.label.split(",") if label}


def status_figure(m: Measured) -> Figure:
    tm: TokenmillRun = m.tokenmill
    status = [p for p in tm.status if p.ok]
    worst = max((p.seconds for p in status), default=math.nan)
    checks = [p.seconds for p in tm.done_checks if p.ok]
    return Figure(
        name="seed run, `tokenmill status` latency, worst point of the run", unit="s",
        tokenmill=round(worst, 2), baseline=None, baseline_name=None, ratio=None,
        target=f"< {STATUS_LIMIT_S:g} s", met=worst < STATUS_LIMIT_S,
        method="wall clock, `tokenmill status --run R --json` process launch to exit, at 1%, "
               "50%, 100% of committed results and every --status-every s",
        details={"status_at": at_marks(tm.status), "status_runs": len(tm.status),
                 "status_failed": sum(1 for p in tm.status if not p.ok),
                 "status_p50_s": round(sf.percentile([p.seconds for p in status], 50), 3),
                 "done_check_at": at_marks(tm.done_checks),
                 "done_check_p50_s": round(sf.percentile(checks, 50), 3),
                 "done_check_p99_s": round(sf.percentile(checks, 99), 3),
                 "done_check_max_s": round(max(checks, default=math.nan), 3)})


def topic_figure(m: Measured) -> Figure:
    tm: TokenmillRun = m.tokenmill
    t0, t1 = tm.launched_at, tm.ended_at
    mid = (t0 + t1) / 2
    progress = m.samples.gauges.get("progress_bytes", [])
    first = max((v for t, v in progress if t0 <= t <= mid), default=math.nan)
    second = max((v for t, v in progress if mid < t <= t1), default=math.nan)
    growth = round(second / first, 3) if first else math.nan
    registry = m.samples.gauges.get("registry_bytes", [])
    return Figure(
        name="seed run, progress topic bytes, peak of the second half / peak of the first",
        unit="x", tokenmill=growth, baseline=None, baseline_name=None, ratio=None,
        target="<= 1.5", met=growth <= 1.5,
        method="bytes of every replica's partition directory on the brokers' disks, every "
               "10 s (compacted topic, segment.ms 10 min: linear growth would give 2)",
        details={"progress_bytes_end": progress[-1][1] if progress else None,
                 "progress_bytes_peak": max((v for _, v in progress), default=None),
                 "registry_bytes_end": registry[-1][1] if registry else None})


def loss_figure(m: Measured) -> Figure:
    c = m.checks
    bad = c["lost"] + c["duplicated"] + c["unknown"]
    return Figure(
        name="seed run, prompts lost or duplicated across S3 and the DLQ (by id)",
        unit="prompts", tokenmill=float(bad), baseline=None, baseline_name=None, ratio=None,
        target="<= 0", met=bad <= 0,
        method="every published prompt id (prompts topic, kafka-python) against every S3 "
               "line's id (boto3) and every DLQ record's id (kafka-python)",
        details=dict(c))


UNMEASURED = 1e9  # stands for a figure that could not be measured (JSON has no NaN)


def finite(figure: Figure) -> Figure:
    """A figure whose value or ratio is NaN (nothing sampled) becomes a miss
    with a note, not a NaN (which JSON writes as null)."""
    def bad(x: float | None) -> bool:
        return x is not None and not math.isfinite(x)

    if not (bad(figure.tokenmill) or bad(figure.ratio) or bad(figure.baseline)):
        return figure
    notes = [*figure.details.get("notes", []), "not measured (no samples in the window)"]
    low = figure.target.startswith(">")
    fix = 0.0 if low else UNMEASURED
    return msgspec.structs.replace(
        figure, met=False, details={**figure.details, "notes": notes},
        tokenmill=fix if bad(figure.tokenmill) else figure.tokenmill,
        baseline=fix if bad(figure.baseline) else figure.baseline,
        ratio=fix if bad(figure.ratio) else figure.ratio)


def build_figures(m: Measured, args: argparse.Namespace) -> list[Figure]:
    table = process_table(m)
    figures = [finite(f) for f in (makespan_figure(m), busy_figure(m), rss_figure(m, table),
                                   status_figure(m), topic_figure(m), loss_figure(m))]
    figures[0].details["time_scale"] = args.time_scale
    figures[0].details["text_words"] = args.text_words
    return figures


# ---------------------------------------------------------------- outputs


def save_samples(out: Path, m: Measured) -> Path:
    """Every sample, for re-plotting (gzip JSON beside the results)."""
    path = out.with_name(out.stem + ".samples.json.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"windows": side_windows(m), "samples": msgspec.to_builtins(m.samples),
            "status": [msgspec.to_builtins(p.__dict__) for p in m.tokenmill.status],
            "done_checks": [msgspec.to_builtins(p.__dict__) for p in m.tokenmill.done_checks]}
    path.write_bytes(gzip.compress(msgspec.json.encode(data)))
    return path


def plots(out: Path, m: Measured) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        console.print("matplotlib is missing (pip install -e '.[bench]'): no plots")
        return
    stem = out.with_suffix("")
    tm: TokenmillRun = m.tokenmill
    samples: Samples = m.samples
    seed_plots.gpus(Path(f"{stem}-gpus.png"), side_windows(m), samples.gpu, SLOTS)
    rss = {n: [s for s in v if tm.launched_at <= s[0] <= tm.ended_at + 60]
           for n, v in samples.rss.items() if n != "baseline"}
    seed_plots.rss(Path(f"{stem}-rss.png"), tm.launched_at, rss)
    seed_plots.workers(Path(f"{stem}-workers.png"), tm.launched_at, tm.ended_at, samples.workers)
    seed_plots.latency(Path(f"{stem}-status.png"), tm.launched_at,
                       [(p.at, p.seconds) for p in tm.status if p.ok],
                       [(p.at, p.seconds) for p in tm.done_checks if p.ok], STATUS_LIMIT_S)


if __name__ == "__main__":
    main()
