"""Prompts/s for `tokenmill produce` on one core, next to a naive baseline.

Generates a synthetic mixed dataset (ShareGPT single- and multi-turn, OpenAI
with and without system prompts, OpenAI tool calls, Hermes function calling,
Alpaca, plain prompts; five JSONL files, tool prompts in their own file as in
the seed run), then runs, each as a subprocess pinned to one core:

- baseline: `json.loads` of every line plus a plain confluent-kafka produce
  loop of the same lines (no normalization, no dedupe, no transactions);
- `tokenmill produce` on the same files: fingerprint, read + normalize +
  dedupe + spool (pass 1), mixed transactional publishing (pass 2).

Both are timed the same way: wall clock from launch to exit (the baseline
exits after its final flush, tokenmill after its last transaction commits),
so interpreter start-up and imports count on both sides. The verdict uses
that wall-clock rate. CPU seconds and peak RSS are the child's own
(`os.wait4` rusage), reported in their own columns: on a shared machine,
wall time also counts the time other processes held the core (the load
average is recorded). The broker comes from TOKENMILL_BOOTSTRAP_SERVERS (and
the other TOKENMILL_* variables) if set, else a private dev stack.

    python bench/bench_producer.py [--prompts 1000000] [--gpus 7] [--data-dir DIR]
                                   [--out bench/results/producer.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.figures import Figure, Recorder, console_table, ratio
from bench.services import bench_settings, child_env, tokenmill_argv
from bench.timing import Exited, Launched
from producer import synthetic

TARGET = 20_000  # prompts/s: the seed's 914K prompts in under a minute
RSS_LIMIT_MB = 500
FILES = {  # file -> kinds it holds
    "sharegpt.jsonl": ("sharegpt", "sharegpt-multi"),
    "openai.jsonl": ("openai", "openai-system"),
    "alpaca.jsonl": ("alpaca",),
    "plain.jsonl": ("prompt",),
    "tools.jsonl": ("openai-tools", "hermes"),
}

BASELINE = r"""
import json, sys, time
from confluent_kafka import Producer
bootstrap, topic, files = sys.argv[1], sys.argv[2], sys.argv[3:]
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50,
                     "compression.type": "lz4", "message.max.bytes": 8388608})
count = 0
start = time.monotonic()
for name in files:
    with open(name, "rb") as fh:
        for line in fh:
            json.loads(line)
            while True:
                try:
                    producer.produce(topic, line)
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
            if not count % 10000:
                producer.poll(0)
left = producer.flush(120)
print(json.dumps({"count": count, "seconds": time.monotonic() - start, "unsent": left}))
"""


def generate(directory: Path, prompts: int) -> list[Path]:
    """The dataset, split by kind into FILES (reused if already there)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / f"complete-{prompts}"
    paths = [directory / name for name in FILES]
    if marker.exists():
        return paths
    encoder = __import__("msgspec").json.Encoder()
    handles = {name: (directory / name).open("wb", buffering=1 << 20) for name in FILES}
    by_kind = {kind: handles[name] for name, kinds in FILES.items() for kind in kinds}
    import random

    rng = random.Random(1)
    names = [k for k, _ in synthetic.KINDS]
    weights = [w for _, w in synthetic.KINDS]
    for serial in range(prompts):
        kind = rng.choices(names, weights)[0]
        by_kind[kind].write(encoder.encode(synthetic.record(kind, serial, rng)) + b"\n")
    for fh in handles.values():
        fh.close()
    marker.touch()
    return paths


def pinned_core() -> set[int] | None:
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None
    return {cores[-1]}


def run_pinned(argv: list[str], env: dict[str, str], core: set[int] | None,
               log: Path) -> tuple[float, Exited]:
    """(wall seconds from launch to exit, the exit with its rusage) of a
    child pinned to one core."""
    child = Launched(argv, env=env, log=log, cwd=ROOT, cores=core)
    exited = child.wait(3600)
    return exited.ended_at - child.launched_at, exited


def create_topic(settings: Any, topic: str, partitions: int) -> None:
    from tokenmill.kafka import clients

    clients.ensure_topics(clients.admin(settings), {topic: partitions})


def log_events(log: Path) -> dict[str, dict[str, Any]]:
    events: dict[str, dict[str, Any]] = {}
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            events[str(event.get("event"))] = event
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--gpus", type=int, default=7)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where the dataset is generated (kept; reused when complete)")
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()
    console = Console(width=200)
    recorder = Recorder("bench_producer")
    work = Path(tempfile.mkdtemp(prefix="bench-producer-"))
    data = args.data_dir or work / "data"
    console.print(f"generating {args.prompts:,} prompts in {data} ...")
    files = generate(data, args.prompts)
    size = sum(f.stat().st_size for f in files)
    counts = Counter({f.name: sum(1 for _ in f.open("rb")) for f in files})

    core = pinned_core()
    others = (set(os.sched_getaffinity(0)) - core) if core else None
    partitions = args.gpus * 4
    run = f"bench-{uuid.uuid4().hex[:8]}"
    with bench_settings(services_cores=others or None) as settings:
        env = child_env(settings)
        topic = f"bench-baseline-{uuid.uuid4().hex[:8]}"
        create_topic(settings, topic, partitions)
        console.print(f"baseline on core {core} ...")
        b_wall, b_exit = run_pinned(
            [sys.executable, "-c", BASELINE, settings.bootstrap_servers, topic,
             *map(str, files)], env, core, work / "baseline.log")
        if b_exit.code != 0:
            raise SystemExit(f"baseline failed ({b_exit.code}); see {work / 'baseline.log'}")
        baseline = json.loads(b_exit.stdout.strip().splitlines()[-1])
        if baseline["unsent"]:
            raise SystemExit(f"baseline left {baseline['unsent']} records unsent")

        console.print(f"tokenmill produce on core {core} ...")
        wall, exit_ = run_pinned(
            tokenmill_argv("produce", *map(str, files), "--run", run, "--gpus", str(args.gpus),
                           "--no-progress"), env, core, work / "produce.log")
        if exit_.code != 0:
            raise SystemExit(f"tokenmill produce failed ({exit_.code}); see {work / 'produce.log'}")
        events = log_events(work / "produce.log")
    published = events.get("published", {})
    read = events.get("inputs read", {})

    prompts = int(published.get("prompts", 0))
    base_rate = baseline["count"] / b_wall
    rate = prompts / wall
    phases = Table(title="tokenmill produce, its own phases (from its log)")
    for column in ("phase", "prompts", "wall s", "prompts/s"):
        phases.add_column(column, justify="left" if column == "phase" else "right")
    for label, event in (("pass 1: read, normalize, dedupe, spool", read),
                         ("pass 2: mixed transactional publish", published)):
        seconds = float(event.get("seconds", 0) or 0)
        n = int(event.get("prompts", 0) or 0)
        phases.add_row(label, f"{n:,}", f"{seconds:.1f}",
                       f"{n / seconds:,.0f}" if seconds else "-")
    method = ("wall clock, process launch to exit, both pinned to one core (tokenmill exits "
              "after its last transaction commits; the baseline after its final flush)")
    baseline_name = "json.loads + plain confluent-kafka produce, one core"
    dataset = {"prompts": args.prompts, "bytes": size, "files": dict(counts),
               "partitions": partitions, "published": prompts,
               "baseline_records": baseline["count"]}
    figures = [
        Figure(name=f"producer, {args.prompts:,} mixed prompts, {partitions} partitions",
               unit="prompts/s", tokenmill=round(rate), baseline=round(base_rate),
               baseline_name=baseline_name, ratio=ratio(rate, base_rate),
               target=f">= {TARGET:,} prompts/s on one core", met=rate >= TARGET, method=method,
               tokenmill_wall_s=round(wall, 2), baseline_wall_s=round(b_wall, 2),
               tokenmill_cpu_s=round(exit_.cpu_s, 1), baseline_cpu_s=round(b_exit.cpu_s, 1),
               details={**dataset,
                        "tokenmill_prompts_per_cpu_s": round(prompts / exit_.cpu_s),
                        "baseline_prompts_per_cpu_s": round(baseline["count"] / b_exit.cpu_s),
                        "seed_914k_prompts_wall_s": round(914_000 / rate),
                        "pass1_seconds": read.get("seconds"),
                        "pass2_seconds": published.get("seconds")}),
        Figure(name="producer peak RSS", unit="MB", tokenmill=round(exit_.peak_rss_bytes / 2**20),
               baseline=round(b_exit.peak_rss_bytes / 2**20), baseline_name=baseline_name,
               ratio=ratio(exit_.peak_rss_bytes, b_exit.peak_rss_bytes),
               target=f"< {RSS_LIMIT_MB} MB", met=exit_.peak_rss_bytes < RSS_LIMIT_MB * 2**20,
               method="peak resident set size of the process (os.wait4 rusage), same runs"),
    ]
    recorder.write(args.out, figures)
    console.print(phases)
    console.print(console_table(f"producer: {args.prompts:,} synthetic prompts, "
                                f"{size / 1e9:.2f} GB in {len(files)} files, {partitions} "
                                "partitions, one core (wall clock)", figures))
    console.print(f"files: {dict(counts)}")
    console.print(f"logs and state in {work}" + (f"; raw results: {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
