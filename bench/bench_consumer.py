"""Consumer benchmarks, each against a simulator in its own process.

(a) EOS overhead: committed completions/s through one consumer at zero delay
    (target >= 1,500/s: a GPU does 1-10/s, the pipeline must never be the
    bottleneck), next to a plain asyncio loop against the same simulator.
(b) saturation: tokenmill's throughput / a plain asyncio loop with the same
    concurrency, against a simulator with the seed run's capacity (64 running
    requests, ~3,600 tok/s per GPU), time-scaled (target >= 0.97).
(c) --concurrency auto from a cold start: generated tokens/s as a share of
    the simulator's configured capacity (target >= 0.95).

    python bench/bench_consumer.py [--prompts 20000] [--only a,b,c]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import aiohttp
import msgspec
from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.services import bench_settings  # noqa: E402
from consumer.backoff import RetryPolicy  # noqa: E402
from consumer.sglang_client import request_body  # noqa: E402
from consumer.worker import Worker, WorkerConfig  # noqa: E402
from schemas import GenerationSettings, Message, PromptRecord, RunSpec, decode_completion  # noqa: E402
from schemas.progress import ProducerCheckpoint, producer_key  # noqa: E402
from tokenmill import log, topics  # noqa: E402
from tokenmill.registry import RunRegistry  # noqa: E402
from tokenmill.settings import Settings  # noqa: E402
from tokenmill.simulator import SimulatorConfig  # noqa: E402
from tokenmill.simulator.runner import SimulatorProcess  # noqa: E402

console = Console()

ZERO = SimulatorConfig(zero_delay=True, length_median=30, length_sigma=0.3, length_max=80)
# The seed run: 64 running requests per GPU, ~3,600 tok/s per GPU, ~2,400-token answers.
TIME_SCALE = 40.0
SEED_GPU = SimulatorConfig(max_running_requests=64, decode_rate=60.0, max_total_tok_s=3600.0,
                           prefill_rate=0, time_scale=TIME_SCALE, speculative_accept_length=3.0)


def prompts_for(run_id: str, n: int) -> list[PromptRecord]:
    return [PromptRecord(id=f"{run_id}-{i}", run=run_id, source="bench", format="plain",
                         category="plain", seq=i,
                         messages=(Message(role="user", content=f"Benchmark question {i}?"),))
            for i in range(n)]


def setup_run(settings: Settings, n: int, partitions: int, max_tokens: int) -> RunSpec:
    run_id = f"bench{uuid.uuid4().hex[:8]}"
    spec = RunSpec(run_id=run_id, partitions=partitions,
                   generation=GenerationSettings(model="sim", max_tokens=max_tokens))
    RunRegistry(settings).create_run(spec)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                         "transactional.id": f"bench.{run_id}", "linger.ms": 20})
    producer.init_transactions(30)
    producer.begin_transaction()
    for prompt in prompts_for(run_id, n):
        producer.produce(topics.prompts_topic(run_id), key=prompt.id.encode(),
                         value=msgspec.json.encode(prompt), partition=prompt.seq % partitions)
        producer.poll(0)
    producer.produce(topics.progress_topic(run_id), key=producer_key(run_id).encode(),
                     value=msgspec.json.encode(ProducerCheckpoint(run=run_id, next_seq=n, total=n,
                                                                  done=True)))
    producer.commit_transaction(60)
    return spec


def committed_window(settings: Settings, run_id: str) -> tuple[int, float, int]:
    """(records, seconds between first and last commit, completion tokens)."""
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "bench-read",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    topic = topics.completions_topic(run_id)
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    remaining = set(parts)
    first, last, count, tokens = float("inf"), 0.0, 0, 0
    while remaining:
        for m in consumer.consume(1000, timeout=1):
            if m.error():
                remaining.discard(m.partition())
                continue
            ts = m.timestamp()[1] / 1000
            first, last = min(first, ts), max(last, ts)
            count += 1
            tokens += decode_completion(m.value()).usage.completion_tokens  # type: ignore[union-attr]
    consumer.close()
    return count, last - first, tokens


def run_worker(settings: Settings, spec: RunSpec, url: str, concurrency: int | None) -> float:
    config = WorkerConfig(instance=f"bench-{uuid.uuid4().hex[:6]}", sglang_url=url,
                          concurrency=concurrency, commit_interval_s=1.0, until_done=True,
                          done_check_interval_s=0.5, retry=RetryPolicy(base_s=0.1))
    started = time.monotonic()
    asyncio.run(Worker(settings, spec, config).run())
    return time.monotonic() - started


async def plain_loop(url: str, prompts: list[PromptRecord], concurrency: int,
                     generation: GenerationSettings) -> tuple[float, int]:
    """The baseline: N requests through a semaphore, nothing else."""
    semaphore = asyncio.Semaphore(concurrency)
    tokens = 0

    async def one(session: aiohttp.ClientSession, prompt: PromptRecord) -> None:
        nonlocal tokens
        async with semaphore:
            async with session.post(f"{url}/v1/chat/completions",
                                    json=request_body(prompt, generation)) as response:
                body = await response.json()
                tokens += body["usage"]["completion_tokens"]

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.monotonic()
        await asyncio.gather(*(one(session, p) for p in prompts))
        return time.monotonic() - started, tokens


def bench_a(settings: Settings, n: int, table: Table) -> None:
    with SimulatorProcess(ZERO) as sim:
        spec = setup_run(settings, n, partitions=8, max_tokens=64)
        run_worker(settings, spec, sim.base_url, concurrency=256)
        count, window, _ = committed_window(settings, spec.run_id)
        base_s, _ = asyncio.run(plain_loop(sim.base_url, prompts_for("plain", n), 256,
                                           spec.generation))
    rate, base = count / window, n / base_s
    table.add_row("(a) EOS overhead, zero delay", f"{rate:,.0f} completions/s",
                  f"{base:,.0f} req/s", f"{rate / base:.2f}", ">= 1,500/s",
                  "[green]met[/]" if rate >= 1500 else "[red]missed[/]")


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

    def __enter__(self) -> TokenRate:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def rate(self, skip_start: float = 0.0, skip_end: float = 0.1) -> float:
        """Tokens/s over the active window (first to last token), without the
        given shares of its start and end (ramp-up, the drain of the tail)."""
        active = [s for s in self.samples if s[1] > self.samples[0][1]]
        last_value = self.samples[-1][1]
        active = [s for s in active if s[1] < last_value] or active
        t0, t1 = active[0][0], active[-1][0]
        lo, hi = t0 + (t1 - t0) * skip_start, t1 - (t1 - t0) * skip_end
        window = [s for s in active if lo <= s[0] <= hi]
        return (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])


def bench_b(settings: Settings, n: int, table: Table) -> None:
    concurrency = 72
    with SimulatorProcess(SEED_GPU) as sim, TokenRate(sim.base_url) as meter:
        asyncio.run(plain_loop(sim.base_url, prompts_for("plain", n), concurrency,
                               GenerationSettings(model="sim", max_tokens=8192)))
    base = meter.rate(skip_start=0.1)
    with SimulatorProcess(SEED_GPU) as sim, TokenRate(sim.base_url) as meter:
        spec = setup_run(settings, n, partitions=4, max_tokens=8192)
        run_worker(settings, spec, sim.base_url, concurrency=concurrency)
    ours = meter.rate(skip_start=0.1)
    table.add_row(f"(b) saturation, seed GPU x{TIME_SCALE:.0f} time, concurrency {concurrency}",
                  f"{ours:,.0f} tok/s", f"{base:,.0f} tok/s (plain asyncio loop)",
                  f"{ours / base:.3f}", ">= 0.97",
                  "[green]met[/]" if ours / base >= 0.97 else "[red]missed[/]")


def bench_c(settings: Settings, n: int, table: Table) -> None:
    with SimulatorProcess(SEED_GPU) as sim, TokenRate(sim.base_url) as meter:
        spec = setup_run(settings, n, partitions=4, max_tokens=8192)
        run_worker(settings, spec, sim.base_url, concurrency=None)
    capacity = SEED_GPU.max_total_tok_s * TIME_SCALE
    rate = meter.rate(skip_start=0.0)  # cold start included
    share = rate / capacity
    table.add_row("(c) --concurrency auto, cold start", f"{rate:,.0f} tok/s",
                  f"{capacity:,.0f} tok/s (configured)", f"{share:.3f}", ">= 0.95",
                  "[green]met[/]" if share >= 0.95 else "[red]missed[/]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=20_000, help="prompts for (a)")
    parser.add_argument("--saturation-prompts", type=int, default=3_000, help="prompts for (b), (c)")
    parser.add_argument("--only", default="a,b,c")
    args = parser.parse_args()
    log.configure("warning", "console")
    table = Table(title="tokenmill consumer benchmarks")
    for column in ("benchmark", "tokenmill", "baseline", "ratio", "target", ""):
        table.add_column(column)
    with bench_settings() as settings:
        if "a" in args.only:
            bench_a(settings, args.prompts, table)
        if "b" in args.only:
            bench_b(settings, args.saturation_prompts, table)
        if "c" in args.only:
            bench_c(settings, args.saturation_prompts, table)
    console.print(table)


if __name__ == "__main__":
    main()
