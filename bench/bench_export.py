"""Records/s and peak memory of `tokenmill export` on a 1M-record lineage,
next to a plain read-and-write of the same S3 objects in the same run.

Setup (not timed): a lineage of two finished runs written straight into the
broker and the S3 server, the way the sink leaves them: a root run of N
prompts whose accepted results lie in S3 in objects of 500 lines (keys from
sink/object_keys.py, lines from sink/samples.py), a tenth of them `length`
dead letters on its DLQ, and a redrive of those, all accepted. Progress
counters mark both runs finished. The export holds N records: 90% from the
root, 10% from the redrive, picked by the dead-letter index.

Timed the same way for both (wall clock from launch to exit of a child
process; its CPU time from `os.wait4`; its peak RSS from /proc VmHWM, sampled
every 20 ms, since ru_maxrss would count the forked copy of this process):
- `tokenmill export ROOT --format F --out DIR` for each format asked
  (it reads the registry, the counters and the DLQ, lists and reads every
  object, converts, shards, checksums, writes manifest and card);
- baseline: a child that lists the same objects and reads them with plain
  boto3 (4 threads; the export reads up to 6 objects ahead) and writes their
  bytes to one local file: no parsing, no conversion.

    python bench/bench_export.py [--records 1000000]
        [--formats openai,sharegpt,specforge,parquet] [--reasoning-chars 700]
        [--content-chars 300] [--shard-records 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
import msgspec  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

if TYPE_CHECKING:
    from tokenmill.settings import Settings

TARGET_RPS = 20_000.0
TARGET_RSS_MB = 300.0
BATCH = 500  # lines per object, the sink's default
PARTITIONS = 8
REDRIVE_EVERY = 10  # one prompt in ten is a `length` dead letter of the root


@dataclass
class Measured:
    name: str
    seconds: float
    max_rss_mb: float
    returncode: int
    cpu_seconds: float = 0.0

    def rps(self, records: int) -> float:
        return records / self.seconds


def _peak_rss_kb(pid: int) -> int | None:
    """The process's own high-water RSS (VmHWM). Not ru_maxrss: on Linux that
    also counts the forked copy of this (large) benchmark process before exec."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def measure(name: str, args: list[str], env: dict[str, str]) -> Measured:
    """Launch to exit of a child, wall clock; its peak RSS, sampled every 20 ms
    (a high-water mark, so the last sample holds the peak up to then)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=errors,
                                cwd=ROOT)
        peak = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _peak_rss_kb(proc.pid) or 0)
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            errors.seek(0)
            print(errors.read().decode()[-3000:], file=sys.stderr)
    return Measured(name, seconds, peak / 1024, proc.returncode,
                    usage.ru_utime + usage.ru_stime)


# -- the baseline child ------------------------------------------------------------


def baseline_worker(bucket: str, prefixes: list[str], out: Path) -> None:
    client = boto3.client("s3", endpoint_url=os.environ["TOKENMILL_S3_ENDPOINT_URL"],
                          region_name="us-east-1")
    keys = [item["Key"] for prefix in prefixes
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                         Prefix=prefix)
            for item in page.get("Contents", [])]

    def get(key: str) -> bytes:
        return bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as fh, ThreadPoolExecutor(max_workers=4) as pool:
        for body in pool.map(get, keys):
            fh.write(body)


# -- setup ----------------------------------------------------------------------------


def text_pool(size: int, chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words = ["".join(rng.choices(letters, k=rng.choice((2, 3, 4, 5, 6, 7, 9))))
             for _ in range(4096)]
    return [" ".join(rng.choices(words, k=chars // 4))[:chars] for _ in range(size)]


def produce_waiting(producer: Any, topic: str, **record: Any) -> None:
    """Produce one record, polling while the producer's local queue is full:
    the bench writes faster than the producer drains."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(0.05)


def build_lineage(settings: Settings, bucket: str, records: int, reasoning_chars: int,
                  content_chars: int, console: Console) -> tuple[str, list[str], float]:
    """(root run id, S3 prefixes of the runs, mean line bytes)."""
    from ops.redrive import redrive_spec
    from schemas import (
        Completion,
        DeadLetter,
        GenerationSettings,
        Message,
        PromptRecord,
        RunSpec,
        S3Destination,
        SpecStats,
        Usage,
    )
    from schemas.dlq import HEADER_REASON
    from schemas.progress import ProducerCheckpoint, SinkProgress, producer_key, sink_key
    from sink.object_keys import object_key
    from sink.samples import sample_line
    from tokenmill.kafka import clients, topics
    from tokenmill.registry import RunRegistry

    tag = uuid.uuid4().hex[:8]
    root = RunSpec(run_id=f"bench-{tag}", partitions=PARTITIONS,
                   generation=GenerationSettings(model="Qwen/Qwen3-8B", max_tokens=4096),
                   s3=S3Destination(bucket=bucket))
    child = redrive_spec(root, f"bench-{tag}-8k", {"max_tokens": 8192}, ("length",))
    registry = RunRegistry(settings)
    registry.create_run(root)
    registry.create_run(child)
    reasoning = text_pool(509, reasoning_chars, 1)
    content = text_pool(511, content_chars, 2)

    def completion(spec: RunSpec, i: int, finish: str) -> Completion:
        prompt = PromptRecord(
            id=f"{i:032x}", run=root.run_id,
            messages=(Message("system", "You are a helpful assistant."),
                      Message("user", f"Question {i}: " + content[(i * 3) % 511][:120])),
            source="bench.jsonl", format="openai", category="system-prompt", line=i + 1, seq=i)
        return Completion(
            id=prompt.id, run=spec.run_id, settings_hash=spec.settings_hash, prompt=prompt,
            finish_reason=finish, content=f"{i} " + content[i % 511],
            reasoning_content=f"{i} " + reasoning[(i * 7) % 509],
            usage=Usage(prompt_tokens=60, completion_tokens=250, reasoning_tokens=170),
            spec=SpecStats(accept_length=3.1, verify_ct=80), model="Qwen/Qwen3-8B")

    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    dlq = clients.producer(settings, {"linger.ms": 50})
    redriven = [i for i in range(records) if i % REDRIVE_EVERY == REDRIVE_EVERY - 1]
    total_bytes = 0
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = []
        for spec, ids, finish in ((root, range(records), "stop"), (child, redriven, "stop")):
            lines: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            firsts = dict.fromkeys(range(PARTITIONS), 0)
            offsets = dict.fromkeys(range(PARTITIONS), 0)
            for n, i in enumerate(ids):
                p = n % PARTITIONS
                if spec is root and i % REDRIVE_EVERY == REDRIVE_EVERY - 1:
                    record = completion(root, i, "length")
                    envelope = DeadLetter(id=record.id, run=root.run_id, reason="length",
                                          detail="finish_reason=length", source_topic="bench",
                                          source_partition=p, source_offset=offsets[p],
                                          record=record)
                    produce_waiting(dlq, topics.dlq_topic(root.run_id), key=record.id.encode(),
                                    value=msgspec.json.encode(envelope),
                                    headers=[(HEADER_REASON, b"length")], partition=p)
                else:
                    line = sample_line(completion(spec, i, finish))
                    total_bytes += len(line)
                    lines[p].append(line)
                offsets[p] += 1
                if len(lines[p]) == BATCH:
                    key = object_key("", spec.run_id, p, firsts[p])
                    futures.append(pool.submit(s3.put_object, Bucket=bucket, Key=key,
                                               Body=b"".join(lines[p])))
                    lines[p] = []
                    firsts[p] = offsets[p]
                if n % 100_000 == 0 and n:
                    console.print(f"[dim]  {spec.run_id}: {n:,} records written[/dim]")
            for p, rest in lines.items():
                if rest:
                    futures.append(pool.submit(s3.put_object, Bucket=bucket,
                                               Key=object_key("", spec.run_id, p, firsts[p]),
                                               Body=b"".join(rest)))
        for future in futures:
            future.result()
    assert dlq.flush(120) == 0
    progress = clients.producer(settings)
    for spec, total, accepted in ((root, records, records - len(redriven)),
                                  (child, len(redriven), len(redriven))):
        topic = topics.progress_topic(spec.run_id)
        progress.produce(topic, key=producer_key(spec.run_id).encode(), value=msgspec.json.encode(
            ProducerCheckpoint(run=spec.run_id, next_seq=total, total=total, done=True)))
        progress.produce(topic, key=sink_key(spec.run_id, "bench").encode(),
                         value=msgspec.json.encode(SinkProgress(
                             run=spec.run_id, instance="bench", s3_records=accepted,
                             dlq_records=total - accepted)))
    assert progress.flush(30) == 0
    console.print(f"[dim]setup: {records:,} records in {time.monotonic() - started:.0f}s[/dim]")
    return root.run_id, [f"{root.run_id}/", f"{child.run_id}/"], total_bytes / records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--formats", default="openai,sharegpt,specforge,parquet")
    parser.add_argument("--reasoning-chars", type=int, default=700)
    parser.add_argument("--content-chars", type=int, default=300)
    parser.add_argument("--shard-records", type=int, default=100_000)
    parser.add_argument("--baseline-worker", nargs=3, metavar=("BUCKET", "PREFIXES", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_worker:
        bucket, prefixes, out = args.baseline_worker
        baseline_worker(bucket, prefixes.split(","), Path(out))
        return

    from bench.services import bench_settings
    from tokenmill import log

    log.configure("warning", "console")
    console = Console(width=160)
    with bench_settings() as base, tempfile.TemporaryDirectory(prefix="bench-export-") as tmp:
        from tokenmill.settings import Settings

        bucket = f"bench-export-{uuid.uuid4().hex[:8]}"
        settings = Settings(bootstrap_servers=base.bootstrap_servers,
                            s3_endpoint_url=base.s3_endpoint_url, s3_bucket=bucket,
                            state_dir=Path(tmp) / "state", log_level="warning")
        run_id, prefixes, line_bytes = build_lineage(
            settings, bucket, args.records, args.reasoning_chars, args.content_chars, console)
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
               "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
               "TOKENMILL_S3_BUCKET": bucket,
               "TOKENMILL_STATE_DIR": str(settings.state_dir), "TOKENMILL_LOG_LEVEL": "warning"}
        results: list[tuple[Measured, int]] = []
        baseline = measure("plain boto3 read + write", [
            sys.executable, str(Path(__file__).resolve()), "--baseline-worker", bucket,
            ",".join(prefixes), str(Path(tmp) / "baseline" / "all.jsonl")], env)
        results.append((baseline, (Path(tmp) / "baseline" / "all.jsonl").stat().st_size))
        for fmt in args.formats.split(","):
            out = Path(tmp) / f"export-{fmt}"
            measured = measure(f"tokenmill export --format {fmt}", [
                sys.executable, "-m", "tokenmill.cli", "export", run_id, "--format", fmt,
                "--out", str(out), "--shard-records", str(args.shard_records),
                "--no-progress"], env)
            manifest = json.loads((out / "manifest.json").read_text())
            assert manifest["plan"]["records"] == args.records, manifest["plan"]["records"]
            assert sum(s["records"] for s in manifest["shards"]) == args.records
            results.append((measured, sum(s["bytes"] for s in manifest["shards"])))
    table = Table(title=f"export of a {args.records:,}-record lineage (2 runs, "
                        f"{line_bytes:,.0f} B per S3 line, objects of {BATCH} lines)")
    for column in ("what", "wall s", "records/s", "vs baseline", "CPU s", "peak RSS MB",
                   "output MB",
                   f"≥ {TARGET_RPS:,.0f}/s", f"< {TARGET_RSS_MB:.0f} MB"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for measured, size in results:
        ok = measured.returncode == 0
        is_base = measured is baseline
        table.add_row(
            measured.name, f"{measured.seconds:.1f}", f"{measured.rps(args.records):,.0f}",
            "1.00" if is_base else f"{baseline.seconds / measured.seconds:.2f}",
            f"{measured.cpu_seconds:.1f}", f"{measured.max_rss_mb:,.0f}", f"{size / 1e6:,.0f}",
            "-" if is_base else ("yes" if ok and measured.rps(args.records) >= TARGET_RPS
                                 else "no"),
            "-" if is_base else ("yes" if ok and measured.max_rss_mb < TARGET_RSS_MB else "no"))
    console.print(table)
    console.print("[dim]wall s: launch to exit of the child process; records/s = records / "
                  "wall s; vs baseline: baseline wall s / this wall s; CPU s: the child's user + "
                  "system time (all threads); peak RSS: the child's VmHWM, sampled every 20 ms. "
                  f"Machine: {os.cpu_count()} cores, load average at the end "
                  f"{os.getloadavg()[0]:.1f} (the broker and S3 server share them).[/dim]")


if __name__ == "__main__":
    main()
