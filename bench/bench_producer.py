"""Prompts/s for `tokenmill produce` on one core, next to a naive baseline.

Generates a synthetic mixed dataset (ShareGPT single- and multi-turn, OpenAI
with and without system prompts, OpenAI tool calls, Hermes function calling,
Alpaca, plain prompts; five JSONL files, tool prompts in their own file as in
the seed run), then runs, each as a subprocess pinned to one core:

- baseline: `json.loads` of every line plus a plain confluent-kafka produce
  loop of the same lines (no normalization, no dedupe, no transactions);
- `tokenmill produce` on the same files: fingerprint, read + normalize +
  dedupe + spool (pass 1), mixed transactional publishing (pass 2).

Peak RSS and CPU time are the child's own (`os.wait4` rusage). The rate per
CPU-second is what one dedicated core would do; wall-clock rates are shown
too, and on a shared machine they also count time other processes held the
core (the load average is printed). The broker is started with the dev
stack on free ports unless TOKENMILL_BOOTSTRAP_SERVERS is set.

    python bench/bench_producer.py [--prompts 1000000] [--gpus 7] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from producer import synthetic

TARGET = 20_000  # prompts/s: the seed's 914K prompts in under a minute
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
               log: Path) -> tuple[float, float, int, int, str]:
    """(wall seconds, CPU seconds, peak RSS bytes, exit code, stdout) of a
    child on one core. CPU time (user + system, every thread) is what the
    child would need of a core of its own: on a shared machine, wall time
    also counts the time other processes held that core."""
    with log.open("wb") as err, tempfile.TemporaryFile() as out:
        start = time.monotonic()
        proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=err)
        if core is not None:  # before the child's imports finish and start any thread
            os.sched_setaffinity(proc.pid, core)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        cpu = usage.ru_utime + usage.ru_stime
        return seconds, cpu, usage.ru_maxrss * 1024, proc.returncode, out.read().decode()


def start_broker(state: Path) -> tuple[str, Path]:
    from tokenmill.devstack import stack

    started, _ = stack.up(stack.StackPlan.on_free_ports(state, kafka_heap="1g"))
    return started.bootstrap, state


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from tokenmill import kafka_clients
    from tokenmill.settings import Settings

    settings = Settings(bootstrap_servers=bootstrap)
    kafka_clients.ensure_topics(kafka_clients.admin(settings), {topic: partitions})


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
    args = parser.parse_args()
    console = Console() if Console().is_terminal else Console(width=150)
    work = Path(tempfile.mkdtemp(prefix="bench-producer-"))
    data = args.data_dir or work / "data"
    console.print(f"generating {args.prompts:,} prompts in {data} ...")
    files = generate(data, args.prompts)
    size = sum(f.stat().st_size for f in files)
    counts = Counter({f.name: sum(1 for _ in f.open("rb")) for f in files})

    bootstrap = os.environ.get("TOKENMILL_BOOTSTRAP_SERVERS")
    stack_dir = None
    if not bootstrap:
        console.print("starting a local broker ...")
        bootstrap, stack_dir = start_broker(work / "stack")
    core = pinned_core()
    partitions = args.gpus * 4
    run = f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENMILL_BOOTSTRAP_SERVERS=bootstrap,
               TOKENMILL_STATE_DIR=str(work / "state"), TOKENMILL_LOG_FORMAT="json")
    try:
        topic = f"bench-baseline-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, partitions)
        console.print(f"baseline on core {core} ...")
        b_wall, b_cpu, b_rss, b_code, b_out = run_pinned(
            [sys.executable, "-c", BASELINE, bootstrap, topic, *map(str, files)], env, core,
            work / "baseline.log")
        if b_code != 0:
            raise SystemExit(f"baseline failed ({b_code}); see {work / 'baseline.log'}")
        baseline = json.loads(b_out.strip().splitlines()[-1])

        console.print(f"tokenmill produce on core {core} ...")
        wall, cpu, rss, code, _ = run_pinned(
            [sys.executable, "-m", "tokenmill.cli", "produce", *map(str, files), "--run", run,
             "--gpus", str(args.gpus), "--no-progress"], env, core, work / "produce.log")
        if code != 0:
            raise SystemExit(f"tokenmill produce failed ({code}); see {work / 'produce.log'}")
        events = log_events(work / "produce.log")
        published = events.get("published", {})
        read = events.get("inputs read", {})
    finally:
        if stack_dir is not None:
            from tokenmill.devstack import stack

            stack.down(stack_dir)

    prompts = int(read.get("prompts", 0))
    base_rate = baseline["count"] / b_wall
    base_cpu_rate = baseline["count"] / b_cpu
    rate = prompts / wall
    cpu_rate = prompts / cpu
    table = Table(title=f"producer: {args.prompts:,} synthetic prompts, {size / 1e9:.2f} GB in "
                        f"{len(files)} files, {partitions} partitions, one core")
    for column in ("what", "prompts", "wall s", "prompts/s (wall)", "CPU s",
                   "prompts/CPU-s", "vs baseline", "peak RSS"):
        table.add_column(column, justify="left" if column == "what" else "right")
    table.add_row("baseline: json.loads + plain produce", f"{baseline['count']:,}",
                  f"{b_wall:.1f}", f"{base_rate:,.0f}", f"{b_cpu:.1f}", f"{base_cpu_rate:,.0f}",
                  "1.00x", f"{b_rss / 2**20:,.0f} MB")
    table.add_row("tokenmill produce (whole command)", f"{prompts:,}", f"{wall:.1f}",
                  f"{rate:,.0f}", f"{cpu:.1f}", f"{cpu_rate:,.0f}",
                  f"{cpu_rate / base_cpu_rate:.2f}x", f"{rss / 2**20:,.0f} MB")
    for label, event in (("  pass 1: read, normalize, dedupe, spool", read),
                         ("  pass 2: mixed transactional publish", published)):
        seconds = float(event.get("seconds", 0) or 0)
        n = int(event.get("prompts", 0) or 0)
        table.add_row(label, f"{n:,}", f"{seconds:.1f}",
                      f"{n / seconds:,.0f}" if seconds else "-", "", "", "", "")
    console.print(table)
    console.print(f"files: {dict(counts)}")
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    verdict = "[green]meets" if cpu_rate >= TARGET else "[red]misses"
    console.print(f"{verdict} the target[/] of {TARGET:,} prompts/s on one core: {cpu_rate:,.0f} "
                  f"per CPU-second ({rate:,.0f}/s wall; the seed's 914K prompts in "
                  f"{914_000 / cpu_rate:.0f} s of one core, {914_000 / rate:.0f} s wall here); "
                  f"peak RSS {rss / 2**20:,.0f} MB (limit 500 MB); load average {load}")
    console.print(f"logs and state in {work}")


if __name__ == "__main__":
    main()
