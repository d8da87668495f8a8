"""Records/s the sink moves from `.completions` into S3 on one core, next
to plain boto3 puts of the same objects.

Feeds N completion records into a run's completions topic with a
transactional producer (as the consumer does), then launches `tokenmill sink
--until-done` pinned to one core (the broker and S3 server on the others) and
times it from launch to the moment its group has committed the offset of the
last record on every partition (uploads finish before that commit, so this
is the last committed record; start-up, group join and the final commit
included). The objects it wrote are then put again with plain boto3
(`put_object`, same sizes, same concurrency) by a script in its own process
on the same core, timed from launch to its last put. Records/s for the
baseline = the same records / its seconds; the ratio is tokenmill's rate /
the baseline's. CPU seconds of each process (launch to exit) are reported
apart.

Two record shapes (the measured mean size of an encoded record is in the
results and the README table):
- realistic: ~7,000 characters of reasoning + ~3,000 of answer, i.e. a
  ~2,400-token completion; about 11 KB of JSON per record;
- small: 250 + 120 characters; about 1.2 KB per record (the prompt and the
  metadata dominate), to show the per-record overhead.

Kafka and S3 come from TOKENMILL_BOOTSTRAP_SERVERS and
TOKENMILL_S3_ENDPOINT_URL (and the other TOKENMILL_* variables; S3
credentials from boto3's usual chain) if set, else a dev stack on free ports
is started for the benchmark and stopped after it.

    python bench/bench_sink.py [--records 20000] [--small-records 50000]
                               [--partitions 4] [--batch-size 500]
                               [--compression none|zstd] [--out bench/results/sink.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3
import msgspec
from rich.console import Console

from bench.figures import Figure, Recorder, console_table, ratio
from bench.services import bench_settings, child_env, tokenmill_argv
from bench.timing import CommittedReached, DeliveredEnds, Launched, wait_until
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
from tokenmill import log
from tokenmill.kafka import clients, topics
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


def _records(spec: RunSpec, case: Case) -> Iterator[Completion]:
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


def _feed(settings: Settings, spec: RunSpec, case: Case) -> tuple[float, dict[int, int]]:
    """Commit the case's records, 100 per transaction; returns (mean record
    bytes, partition -> last offset + 1)."""
    producer = clients.transactional_producer(settings, f"bench-feed-{spec.run_id}")
    producer.init_transactions(30)
    topic = topics.completions_topic(spec.run_id)
    ends = DeliveredEnds()
    total = 0
    producer.begin_transaction()
    for i, record in enumerate(_records(spec, case)):
        value = encode_record(record)
        total += len(value)
        while True:
            try:
                producer.produce(topic, key=record.id.encode(), value=value,
                                 partition=i % spec.partitions, on_delivery=ends)
                break
            except BufferError:
                producer.poll(0.05)
        if (i + 1) % 100 == 0:
            producer.commit_transaction(60)
            producer.begin_transaction()
    producer.commit_transaction(60)
    checkpoint = ProducerCheckpoint(run=spec.run_id, next_seq=case.records, total=case.records,
                                    done=True)
    plain = clients.producer(settings)
    plain.produce(topics.progress_topic(spec.run_id), key=producer_key(spec.run_id).encode(),
                  value=encode_record(checkpoint))
    plain.flush(30)
    return total / case.records, dict(ends.ends)


BASELINE = r"""
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
import boto3
endpoint, region, bucket, directory, concurrency = sys.argv[1:6]
client = boto3.client("s3", endpoint_url=endpoint or None, region_name=region)
names = sorted(os.listdir(directory))
def put(name):
    with open(os.path.join(directory, name), "rb") as fh:
        client.put_object(Bucket=bucket, Key="baseline/" + name, Body=fh.read())
    return time.time()
with ThreadPoolExecutor(max_workers=int(concurrency)) as pool:
    last = max(pool.map(put, names))
print(json.dumps({"objects": len(names), "last_at": last}))
"""


@dataclass
class Measured:
    wall_s: float
    cpu_s: float


def _sink(settings: Settings, spec: RunSpec, ends: dict[int, int], args: argparse.Namespace,
          core: set[int], work: Path) -> Measured:
    """`tokenmill sink --until-done`, launch to the group's last commit."""
    argv = tokenmill_argv("sink", "--run", spec.run_id, "--instance", "bench", "--until-done",
                          "--batch-size", str(args.batch_size), "--max-batch-age", "600",
                          "--upload-concurrency", str(args.upload_concurrency),
                          "--compression", args.compression, "--create-bucket",
                          "--log-level", "warning")
    committed = CommittedReached(settings, topics.sink_group(spec.run_id),
                                 topics.completions_topic(spec.run_id), ends)
    sink = Launched(argv, env=child_env(settings), log=work / f"{spec.run_id}.log", cwd=ROOT,
                    cores=core)
    try:
        done_at = wait_until(committed, [sink], 1800, "commit of every record")
        exited = sink.wait(120)
    finally:
        committed.close()
        sink.kill()
    if exited.code != 0:
        raise RuntimeError(f"sink exited with {exited.code}; log: {sink.log}")
    return Measured(done_at - sink.launched_at, exited.cpu_s)


def _objects(settings: Settings, bucket: str, directory: Path) -> int:
    """Download what the sink wrote (for the baseline); returns total bytes."""
    client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url,
                          region_name=settings.s3_region)
    directory.mkdir(parents=True)
    total, count = 0, 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            (directory / f"{count:08d}").write_bytes(body)
            total, count = total + len(body), count + 1
    client.create_bucket(Bucket=bucket + "-base")
    return total


def _baseline(settings: Settings, bucket: str, directory: Path, concurrency: int,
              core: set[int], work: Path) -> Measured:
    put = Launched([sys.executable, "-c", BASELINE, settings.s3_endpoint_url or "",
                    settings.s3_region, bucket + "-base", str(directory), str(concurrency)],
                   env=os.environ, log=work / f"{bucket}-baseline.log", cwd=ROOT, cores=core)
    exited = put.wait(1800)
    if exited.code != 0:
        raise RuntimeError(f"baseline failed ({exited.code}); log: {put.log}")
    report = json.loads(exited.stdout.strip().splitlines()[-1])
    return Measured(report["last_at"] - put.launched_at, exited.cpu_s)


def run_case(settings: Settings, case: Case, args: argparse.Namespace, core: set[int],
             work: Path) -> Figure:
    run_id = f"bench-{case.name}-{uuid.uuid4().hex[:8]}"
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    settings = msgspec.structs.replace(settings, s3_bucket=bucket)
    spec = RunSpec(run_id=run_id, partitions=args.partitions,
                   generation=GenerationSettings(model="bench"))
    RunRegistry(settings).create_run(spec)
    record_bytes, ends = _feed(settings, spec, case)
    ours = _sink(settings, spec, ends, args, core, work)
    s3_bytes = _objects(settings, bucket, work / bucket)
    base = _baseline(settings, bucket, work / bucket, args.upload_concurrency, core, work)
    rate, base_rate = case.records / ours.wall_s, case.records / base.wall_s
    return Figure(
        name=f"sink, {case.name} records ({record_bytes / 1000:.1f} KB), {case.records:,}",
        unit="records/s", tokenmill=round(rate), baseline=round(base_rate),
        baseline_name="plain boto3 put_object of the same objects, same concurrency",
        ratio=ratio(rate, base_rate), target=f">= {TARGET_RPS:,.0f} records/s",
        met=rate >= TARGET_RPS,
        method="wall clock, process launch to the sink group's commit of the last record "
               "(tokenmill sink, one core) / launch to the last put (boto3 script, same core)",
        tokenmill_wall_s=round(ours.wall_s, 2), baseline_wall_s=round(base.wall_s, 2),
        tokenmill_cpu_s=round(ours.cpu_s, 1), baseline_cpu_s=round(base.cpu_s, 1),
        details={"record_bytes": round(record_bytes), "s3_bytes": s3_bytes,
                 "tokenmill_s3_mb_per_s": round(s3_bytes / ours.wall_s / 1e6, 1),
                 "baseline_s3_mb_per_s": round(s3_bytes / base.wall_s / 1e6, 1),
                 "tokenmill_records_per_cpu_s": round(case.records / ours.cpu_s),
                 "partitions": args.partitions, "batch_size": args.batch_size,
                 "upload_concurrency": args.upload_concurrency,
                 "compression": args.compression})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000,
                        help="records of realistic size (~11 KB)")
    parser.add_argument("--small-records", type=int, default=50_000,
                        help="records of ~1.2 KB (0: skip the case)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--upload-concurrency", type=int, default=4)
    parser.add_argument("--compression", choices=["none", "zstd"], default="none")
    parser.add_argument("--out", type=Path, default=None, help="write the raw results (JSON)")
    args = parser.parse_args()

    log.configure("warning", "console")
    console = Console(width=200)
    recorder = Recorder("bench_sink")
    sink_core, others = _cores()
    cases = [Case("realistic", args.records, 7000, 3000)]
    if args.small_records:
        cases.append(Case("small", args.small_records, 250, 120))
    work = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    figures = []
    with bench_settings(services_cores=others or None) as settings:
        for case in cases:
            console.print(f"[dim]{case.name}: feeding {case.records:,} records...[/dim]")
            figures.append(run_case(settings, case, args, sink_core, work))
    recorder.write(args.out, figures)
    console.print(console_table(
        f"tokenmill sink: .completions -> S3 ({args.partitions} partitions, batch "
        f"{args.batch_size}, compression {args.compression}, one core; wall clock)", figures))
    console.print(f"logs: {work}" + (f"; raw results: {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
