"""Records/s and MB/s the sink moves from `.completions` into S3 on one core.

Feeds N completion records of realistic size (~2,400 tokens: ~7 KB of
reasoning + ~3 KB of answer, ~10 KB of JSON each) into a run's completions
topic with a transactional producer (as the consumer does), then runs the
sink service in this process, pinned to one core, with `--until-done`
semantics, and times it from its partition assignment to its exit. The same
bytes are then uploaded with plain boto3 `put_object` (same object sizes,
same concurrency) as a baseline; the table shows both rates and their ratio.
A small-record case (~600 B) shows the per-record overhead.

The local broker and S3 server (moto) come from `TOKENMILL_BOOTSTRAP_SERVERS`
and `TOKENMILL_S3_ENDPOINT_URL` if set, else a dev stack on free ports
is started for the benchmark and stopped after it.

    python bench/bench_sink.py [--records 20000] [--small-records 50000]
                               [--partitions 4] [--batch-size 500]
                               [--compression none|zstd] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import random
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3
from rich.console import Console
from rich.table import Table

from schemas import (
    Completion,
    GenerationSettings,
    Message,
    ProducerCheckpoint,
    PromptRecord,
    RunSpec,
    SpecStats,
    Usage,
    encode_record,
)
from schemas.progress import producer_key
from sink.batcher import BatchLimits
from sink.config import resolve
from sink.service import SinkService, tune_gc
from tokenmill import kafka_clients, topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

TARGET_RPS = 10_000.0
POOL = 512  # distinct texts per field: objects are not unrealistically compressible


@dataclass
class Case:
    name: str
    records: int
    reasoning_chars: int
    content_chars: int


@dataclass
class Result:
    case: Case
    record_bytes: float
    timing: Timing
    baseline_seconds: float

    @property
    def rps(self) -> float:
        return self.case.records / self.timing.seconds

    @property
    def rps_per_core(self) -> float:
        """Records per second of the sink process's CPU time (all threads)."""
        return self.case.records / self.timing.cpu_seconds

    @property
    def mbps(self) -> float:
        return self.timing.s3_bytes / self.timing.seconds / 1e6

    @property
    def in_mbps(self) -> float:
        return self.case.records * self.record_bytes / self.timing.seconds / 1e6

    @property
    def baseline_mbps(self) -> float:
        return self.timing.s3_bytes / self.baseline_seconds / 1e6


def _pin(pid: int, cores: set[int]) -> None:
    try:
        os.sched_setaffinity(pid, cores)
    except (AttributeError, OSError):
        pass


def _cores() -> tuple[set[int], set[int]]:
    """(the sink's one core, the cores left for the broker and S3)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return set(), set()
    if len(cores) < 2:
        return set(cores), set(cores)
    return {cores[-1]}, set(cores[:-1])


def _vocabulary(rng: random.Random, size: int = 4096) -> list[str]:
    """Pseudo-words with English-like lengths; random text from them compresses
    about as well as model output does (zstd ~3-4x)."""
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    return ["".join(rng.choices(letters, weights, k=rng.choice((1, 2, 2, 3, 3, 4, 4, 5, 6, 7,
                                                                  8, 9, 11))))
            for _ in range(size)]


def _text_pool(size: int, chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng)
    pool = []
    for _ in range(size):
        words = rng.choices(vocabulary, k=chars // 4)
        pool.append(" ".join(words)[:chars])
    return pool


def _records(spec: RunSpec, case: Case):
    reasoning = _text_pool(POOL, case.reasoning_chars, 1)
    content = _text_pool(POOL, case.content_chars, 2)
    for i in range(case.records):
        prompt = PromptRecord(
            id=f"{i:016x}", run=spec.run_id,
            messages=(Message(role="system", content="You are a helpful assistant."),
                      Message(role="user", content=f"Question {i}: " + content[i % 509][:300])),
            source="bench.jsonl", format="openai", category="system-prompt", line=i + 1, seq=i)
        yield Completion(
            id=prompt.id, run=spec.run_id, settings_hash=spec.settings_hash, prompt=prompt,
            finish_reason="stop", content=f"{i} " + content[i % POOL],
            reasoning_content=f"{i} " + reasoning[(i * 7) % POOL],
            usage=Usage(prompt_tokens=80, completion_tokens=2400, reasoning_tokens=1700),
            spec=SpecStats(accept_length=3.1, verify_ct=770), model="bench", latency_s=30.0)


def _feed(settings: Settings, spec: RunSpec, case: Case) -> float:
    """Commit the case's records, 100 per transaction; returns mean record bytes."""
    producer = kafka_clients.transactional_producer(settings, f"bench-feed-{spec.run_id}")
    producer.init_transactions(30)
    topic = topics.completions_topic(spec.run_id)
    total = 0
    producer.begin_transaction()
    for i, record in enumerate(_records(spec, case)):
        value = encode_record(record)
        total += len(value)
        while True:
            try:
                producer.produce(topic, key=record.id.encode(), value=value,
                                 partition=i % spec.partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if (i + 1) % 100 == 0:
            producer.commit_transaction(60)
            producer.begin_transaction()
    producer.commit_transaction(60)
    checkpoint = ProducerCheckpoint(run=spec.run_id, next_seq=case.records, total=case.records,
                                    done=True)
    plain = kafka_clients.producer(settings)
    plain.produce(topics.progress_topic(spec.run_id), key=producer_key(spec.run_id).encode(),
                  value=encode_record(checkpoint))
    plain.flush(30)
    return total / case.records


class _TimedSink(SinkService):
    """Times the sink from its first assignment to its last commit (the
    exit after it waits for the until-done check, which is not throughput)."""

    started_at: float | None = None
    last_commit_at: float | None = None
    cpu_at_start = 0.0
    cpu_at_last_commit = 0.0

    def _on_assign(self, consumer, partitions) -> None:  # type: ignore[no-untyped-def]
        if self.started_at is None:
            self.started_at = time.perf_counter()
            self.cpu_at_start = _cpu()
        super()._on_assign(consumer, partitions)

    def _finish_round(self, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super()._finish_round(**kwargs)
        self.last_commit_at = time.perf_counter()
        self.cpu_at_last_commit = _cpu()


def _cpu() -> float:
    """CPU seconds of this process, all threads (librdkafka's and the uploads' too)."""
    times = os.times()
    return times.user + times.system


@dataclass
class Timing:
    seconds: float
    cpu_seconds: float
    s3_bytes: int
    objects: int
    upload_ms: float
    commit_ms: float


def _run_sink(settings: Settings, spec: RunSpec, args: argparse.Namespace,
              profile: cProfile.Profile | None) -> Timing:
    config = resolve(
        settings, spec, instance="bench", compression=args.compression, create_bucket=True,
        limits=BatchLimits(max_records=args.batch_size, max_age_s=600),
        until_done=True, done_check_interval_s=0.2, upload_concurrency=args.upload_concurrency,
        environ={})
    service = _TimedSink(settings=settings, spec=spec, config=config)
    tune_gc()  # as `tokenmill sink` does
    if profile:
        profile.enable()
    code = service.run()
    if profile:
        profile.disable()
    assert code == 0 and service.started_at is not None and service.last_commit_at is not None
    cpu = service.cpu_at_last_commit - service.cpu_at_start
    wall = service.last_commit_at - service.started_at
    registry = service.metrics.registry

    def mean(name: str) -> float:
        count = registry.get_sample_value(f"{name}_count") or 1
        return 1000 * (registry.get_sample_value(f"{name}_sum") or 0) / count

    return Timing(wall, cpu, service.progress.s3_bytes, service.progress.s3_objects,
                  mean("tokenmill_sink_upload_seconds"), mean("tokenmill_sink_commit_seconds"))


def _baseline(settings: Settings, bucket: str, concurrency: int) -> float:
    """Re-upload every object the sink wrote, same bytes, with plain boto3."""
    client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    bodies = [client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys]
    client.create_bucket(Bucket=bucket + "-base")

    def put(item: tuple[int, bytes]) -> None:
        client.put_object(Bucket=bucket + "-base", Key=f"b/{item[0]:08d}", Body=item[1])

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(put, enumerate(bodies)))
    return time.perf_counter() - started


def run_case(settings: Settings, case: Case, args: argparse.Namespace,
             sink_cores: set[int]) -> Result:
    run_id = f"bench-{case.name}-{uuid.uuid4().hex[:8]}"
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    settings = Settings(bootstrap_servers=settings.bootstrap_servers,
                        s3_endpoint_url=settings.s3_endpoint_url, s3_bucket=bucket,
                        log_level="warning", connect_timeout_s=10)
    spec = RunSpec(run_id=run_id, partitions=args.partitions,
                   generation=GenerationSettings(model="bench"))
    RunRegistry(settings).create_run(spec)
    record_bytes = _feed(settings, spec, case)
    before = os.sched_getaffinity(0) if sink_cores else None
    if sink_cores:
        _pin(0, sink_cores)  # the sink and its threads: one core
    profile = cProfile.Profile() if args.profile else None
    try:
        timing = _run_sink(settings, spec, args, profile)
    finally:
        if before:
            _pin(0, before)
    if profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())
    baseline = _baseline(settings, bucket, args.upload_concurrency)
    return Result(case, record_bytes, timing, baseline)


def _services(state_dir: Path) -> tuple[Settings, bool]:
    # The same variables as every other benchmark (README, Benchmarks).
    bootstrap = os.environ.get("TOKENMILL_BOOTSTRAP_SERVERS")
    endpoint = os.environ.get("TOKENMILL_S3_ENDPOINT_URL")
    if bootstrap and endpoint:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        return Settings(bootstrap_servers=bootstrap, s3_endpoint_url=endpoint), False
    from tokenmill.devstack import s3_server, stack

    state, _ = stack.up(stack.StackPlan.on_free_ports(state_dir))
    os.environ["AWS_ACCESS_KEY_ID"] = s3_server.DEV_ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = s3_server.DEV_SECRET_KEY
    _, others = _cores()
    if others:
        _pin(state.brokers[0].pid, others)
        _pin(state.s3.pid, others)
    return Settings(bootstrap_servers=state.bootstrap, s3_endpoint_url=state.s3.address), True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000,
                        help="records of realistic size (~10 KB)")
    parser.add_argument("--small-records", type=int, default=50_000,
                        help="records of ~600 B (0: skip the case)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--upload-concurrency", type=int, default=4)
    parser.add_argument("--compression", choices=["none", "zstd"], default="none")
    parser.add_argument("--profile", action="store_true", help="cProfile the sink")
    args = parser.parse_args()

    from tokenmill import log

    log.configure("warning", "console")
    console = Console(width=160)
    sink_cores, _ = _cores()
    cases = [Case("realistic", args.records, 7000, 3000)]
    if args.small_records:
        cases.append(Case("small", args.small_records, 250, 120))
    with tempfile.TemporaryDirectory(prefix="bench-sink-") as tmp:
        settings, started = _services(Path(tmp))
        try:
            results = []
            for case in cases:
                console.print(f"[dim]{case.name}: feeding {case.records:,} records...[/dim]")
                results.append(run_case(settings, case, args, sink_cores))
        finally:
            if started:
                from tokenmill.devstack import stack

                stack.down(Path(tmp))
    table = Table(title=f"tokenmill sink: .completions -> S3 ({args.partitions} partitions, "
                        f"batch {args.batch_size}, compression {args.compression}, sink "
                        f"pinned to one core)")
    for column in ("case", "records", "record", "objects", "sink rec/s", "in MB/s",
                   "S3 MB/s", "boto3 put MB/s", "sink/boto3", "rec/s per CPU s",
                   "upload ms", "commit ms", f"≥ {TARGET_RPS / 1000:.0f}k rec/s"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r.case.name, f"{r.case.records:,}", f"{r.record_bytes / 1000:.1f} KB",
            f"{r.timing.objects:,}", f"{r.rps:,.0f}", f"{r.in_mbps:,.1f}", f"{r.mbps:,.1f}",
            f"{r.baseline_mbps:,.1f}", f"{r.mbps / r.baseline_mbps:.2f}",
            f"{r.rps_per_core:,.0f}", f"{r.timing.upload_ms:.0f}", f"{r.timing.commit_ms:.0f}",
            "[green]yes[/green]" if r.rps >= TARGET_RPS else "[red]no[/red]")
    console.print(table)
    console.print(
        "[dim]sink rec/s: first assignment to last commit (consume read_committed, decode, "
        "route, encode, upload, transaction). S3 MB/s: object bytes written per second of "
        "that; boto3 put MB/s: the same objects put again with plain boto3 at the same "
        "concurrency (the S3 server's ceiling). rec/s per CPU s: records / CPU seconds the "
        "sink process used over the same span (all threads: librdkafka, uploads), i.e. "
        "what one fully busy core would sustain.[/dim]")


if __name__ == "__main__":
    main()
