"""Fleet scheduling: does a mixed fleet finish together, and how fast does a
stopping worker hand over?

Each case runs on three simulated GPUs (`tokenmill sim-sglang` processes,
--time-scale 10, --max-running-requests 32), 1,200 prompts, max_tokens 4096,
32 requests in flight per worker. Both sides are timed the same way: wall
clock from launch to the last committed result.

(a) mixed fleet, decode rates 60 / 60 / 20 tok/s: tokenmill's makespan (3
    `tokenmill consume` processes, one run of 12 partitions) divided by the
    seed's plain asyncio loop with one shared queue over the same three
    servers (target <= 1.10);
(b) the same on three equal GPUs, 60 / 60 / 60 (target <= 1.02);
(c) SIGTERM of one of three workers mid-run: seconds until every partition it
    owned is owned by another worker's group member (target <= 5).

    python bench/bench_fleet.py [--prompts 1200] [--only a,b,c] [--out bench/results/fleet.json]

Kafka comes from TOKENMILL_BOOTSTRAP_SERVERS if set, else a private dev stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_consumer import prompts_for, setup_run  # noqa: E402
from bench.services import bench_settings  # noqa: E402
from consumer.sglang_client import request_body  # noqa: E402
from schemas import GenerationSettings, PromptRecord  # noqa: E402
from tokenmill import groups, kafka_clients, topics  # noqa: E402
from tokenmill.devstack.processes import free_port  # noqa: E402
from tokenmill.settings import Settings  # noqa: E402
from tokenmill.simulator import SimulatorConfig  # noqa: E402
from tokenmill.simulator.runner import SimulatorProcess  # noqa: E402

console = Console()

TIME_SCALE = 10.0
CONCURRENCY = 32
MAX_TOKENS = 4096
PARTITIONS_PER_GPU = 4


def gpu(decode_rate: float) -> SimulatorConfig:
    return SimulatorConfig(time_scale=TIME_SCALE, max_running_requests=CONCURRENCY,
                           decode_rate=decode_rate, prefill_rate=0)


@dataclass
class Figure:
    name: str
    tokenmill: float
    baseline: float | None
    ratio: float | None
    target: str
    met: bool
    method: str


# -- the baseline: the seed's loop, one shared queue over every server -------------

async def shared_queue(urls: list[str], prompts: list[PromptRecord], concurrency: int,
                       generation: GenerationSettings) -> float:
    """Seconds from start to the last answer: each server pulls the next
    prompt from one shared queue, `concurrency` at a time."""
    queue: asyncio.Queue[PromptRecord] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    started = time.monotonic()
    last = started
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def lane(url: str) -> None:
            nonlocal last
            while True:
                try:
                    prompt = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                async with session.post(f"{url}/v1/chat/completions",
                                        json=request_body(prompt, generation)) as response:
                    await response.read()
                last = max(last, time.monotonic())

        await asyncio.gather(*(lane(url) for url in urls for _ in range(concurrency)))
    return last - started


# -- tokenmill -----------------------------------------------------------------------

def worker_argv(settings: Settings, run_id: str, url: str, instance: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", "consume", "--run", run_id,
            "--sglang-url", url, "--instance", instance, "--concurrency", str(CONCURRENCY),
            "--bootstrap-servers", settings.bootstrap_servers, "--until-done",
            "--session-timeout", "6", "--log-format", "json"]


def start_workers(settings: Settings, run_id: str, urls: list[str],
                  logs: Path) -> list[subprocess.Popen[bytes]]:
    procs = []
    for i, url in enumerate(urls):
        log_file = open(logs / f"{run_id}-w{i}.log", "wb")  # noqa: SIM115
        procs.append(subprocess.Popen(worker_argv(settings, run_id, url, f"w{i}"),
                                      stdout=log_file, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)}))
    return procs


def last_commit_time(settings: Settings, run_id: str) -> tuple[int, float]:
    """(records, broker timestamp of the last committed record, epoch seconds)."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers,
                         "group.id": f"bench-read-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    topic = topics.completions_topic(run_id)
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    remaining, count, last = set(parts), 0, 0.0
    while remaining:
        for m in consumer.consume(1000, timeout=1):
            if m.error():
                remaining.discard(m.partition())
                continue
            count += 1
            last = max(last, m.timestamp()[1] / 1000)
    consumer.close()
    return count, last


def tokenmill_makespan(settings: Settings, urls: list[str], n: int, logs: Path) -> float:
    spec = setup_run(settings, n, PARTITIONS_PER_GPU * len(urls), MAX_TOKENS)
    launched = time.time()
    procs = start_workers(settings, spec.run_id, urls, logs)
    codes = [p.wait(1800) for p in procs]
    if codes != [0] * len(procs):
        raise RuntimeError(f"workers exited with {codes}; logs in {logs}")
    count, last = last_commit_time(settings, spec.run_id)
    if count != n:
        raise RuntimeError(f"{count} committed records for {n} prompts")
    return last - launched


def makespan_case(settings: Settings, name: str, rates: list[float], n: int, target: float,
                  logs: Path) -> Figure:
    sims = [SimulatorProcess(gpu(rate), port=free_port()) for rate in rates]
    urls = [sim.start() for sim in sims]
    try:
        generation = GenerationSettings(model="sim", max_tokens=MAX_TOKENS)
        baseline = asyncio.run(shared_queue(urls, prompts_for("base", n), CONCURRENCY,
                                            generation))
        console.print(f"  {name}: shared-queue loop {baseline:.1f}s")
        ours = tokenmill_makespan(settings, urls, n, logs)
        console.print(f"  {name}: tokenmill {ours:.1f}s")
    finally:
        for sim in sims:
            sim.terminate()
    ratio = ours / baseline
    return Figure(name, round(ours, 2), round(baseline, 2), round(ratio, 3), f"<= {target}",
                  ratio <= target, "wall clock, launch to last committed result; "
                  "baseline: start to last answer")


def handover_case(settings: Settings, n: int, logs: Path) -> Figure:
    """SIGTERM one of three workers once every worker owns partitions;
    seconds until none of its partitions is without another owner."""
    sims = [SimulatorProcess(gpu(60.0), port=free_port()) for _ in range(3)]
    urls = [sim.start() for sim in sims]
    admin = kafka_clients.admin(settings)
    try:
        spec = setup_run(settings, n, PARTITIONS_PER_GPU * 3, MAX_TOKENS)
        group, topic = topics.generate_group(spec.run_id), topics.prompts_topic(spec.run_id)
        procs = start_workers(settings, spec.run_id, urls, logs)

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
        procs[2].send_signal(signal.SIGTERM)
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
            p.send_signal(signal.SIGTERM)
            p.wait(120)
    finally:
        for sim in sims:
            sim.terminate()
    return Figure("(c) SIGTERM hand-over, s", round(seconds, 2), None, None, "<= 5",
                  seconds <= 5, f"SIGTERM to every one of its {len(had)} partitions owned "
                  "by another worker (admin describe, 50 ms polls)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=1200)
    parser.add_argument("--only", default="a,b,c")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    only = set(args.only.split(","))
    figures: list[Figure] = []
    logs = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-fleet-{uuid.uuid4().hex[:6]}"
    logs.mkdir(parents=True)
    with bench_settings() as settings:
        if "a" in only:
            figures.append(makespan_case(settings, "(a) mixed fleet 60/60/20", [60, 60, 20],
                                         args.prompts, 1.10, logs))
        if "b" in only:
            figures.append(makespan_case(settings, "(b) equal fleet 60/60/60", [60, 60, 60],
                                         args.prompts, 1.02, logs))
        if "c" in only:
            figures.append(handover_case(settings, args.prompts * 2, logs))
    table = Table(title="bench_fleet (wall clock)")
    for column in ("benchmark", "tokenmill", "baseline", "ratio", "target", "met"):
        table.add_column(column)
    for f in figures:
        table.add_row(f.name, f"{f.tokenmill}", "-" if f.baseline is None else f"{f.baseline}",
                      "-" if f.ratio is None else f"{f.ratio}", f.target,
                      "yes" if f.met else "NO")
    console.print(table)
    console.print(f"worker logs: {logs}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "bench_fleet", "at": time.time(),
                                        "prompts": args.prompts,
                                        "figures": [asdict(f) for f in figures]}, indent=2))


if __name__ == "__main__":
    main()
