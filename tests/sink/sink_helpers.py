"""Feeding the sink and checking what it wrote.

Records go into `.completions` the way the consumer commits them: with a
transactional confluent producer, a few records per transaction (so offsets
have gaps for the markers), plus an aborted transaction that read_committed
readers must never see. What the sink wrote is read back with plain boto3 and
kafka-python.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import msgspec
import zstandard
from confluent_kafka import Producer

from schemas import (
    Completion,
    CompletionRecord,
    Failure,
    GenerationSettings,
    Message,
    ProducerCheckpoint,
    PromptRecord,
    QAPolicy,
    RunSpec,
    S3Destination,
    SpecStats,
    ToolCall,
    Usage,
    encode_record,
)
from schemas.messages import FunctionCall
from schemas.progress import producer_key
from tests.kafka_helpers import read_all
from tests.service_process import REPO as REPO  # re-exported: tests import it from here
from tests.service_process import ServiceProcess, entry
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings


def make_spec(run_id: str, partitions: int = 2, *, bucket: str | None = None,
              compression: str = "none", enable_thinking: bool = True,
              dlq_reasons: Sequence[str] | None = None) -> RunSpec:
    qa = QAPolicy() if dlq_reasons is None else QAPolicy(dlq_reasons=tuple(dlq_reasons))
    return RunSpec(
        run_id=run_id, partitions=partitions,
        generation=GenerationSettings(model="m", max_tokens=512, enable_thinking=enable_thinking),
        qa=qa,
        s3=S3Destination(bucket=bucket, prefix="out/", compression=compression)  # type: ignore[arg-type]
        if bucket else None,
    )


def prompt(run: str, i: int, *, tools: bool = False) -> PromptRecord:
    return PromptRecord(
        id=f"p{i:06d}", run=run,
        messages=(Message(role="system", content="Be brief."),
                  Message(role="user", content=f"Question number {i}?")),
        source="test.jsonl", format="openai", category="tools" if tools else "system-prompt",
        line=i + 1, seq=i,
        tools=({"type": "function", "function": {"name": "lookup", "parameters": {}}},)
        if tools else None,
    )


def good(spec: RunSpec, i: int, *, text_chars: int = 200) -> Completion:
    body = (f"Answer {i}: " + "lorem ipsum dolor sit amet " * (text_chars // 27 + 1))[:text_chars]
    return Completion(
        id=f"p{i:06d}", run=spec.run_id, settings_hash=spec.settings_hash,
        prompt=prompt(spec.run_id, i), finish_reason="stop", content=body,
        reasoning_content=f"thinking about {i} " + "hmm " * 20,
        usage=Usage(prompt_tokens=20, completion_tokens=60, reasoning_tokens=30),
        spec=SpecStats(accept_length=2.5, verify_ct=20), model="m", latency_s=1.5,
    )


def variant(spec: RunSpec, i: int, kind: str) -> CompletionRecord:
    """One record for each routing outcome."""
    base = good(spec, i)
    if kind == "good":
        return base
    if kind == "failed":
        return Failure(id=base.id, run=spec.run_id, settings_hash=spec.settings_hash,
                       prompt=base.prompt, failure="prompt_too_long",
                       error="context length exceeded", status=400)
    if kind == "length":
        return msgspec.structs.replace(base, finish_reason="length")
    if kind == "empty":
        return msgspec.structs.replace(base, content="", reasoning_content=None)
    if kind == "trivial":
        return msgspec.structs.replace(base, content=" OK. ")
    if kind == "missing_reasoning":
        return msgspec.structs.replace(base, reasoning_content=None)
    if kind == "tool_call":
        return msgspec.structs.replace(
            base, content=None, finish_reason="tool_calls",
            prompt=prompt(spec.run_id, i, tools=True),
            tool_calls=(ToolCall(function=FunctionCall(name="lookup", arguments='{"q": 1}'),
                                 id="call_1"),))
    raise ValueError(kind)


def create_run(settings: Settings, spec: RunSpec) -> None:
    RunRegistry(settings).create_run(spec)


def feed(settings: Settings, spec: RunSpec, records: Iterable[CompletionRecord], *,
         per_transaction: int = 7, with_aborted: bool = True) -> int:
    """Commit the records to `.completions` (record i to partition i % n) in
    small transactions, one aborted transaction in between; returns the count."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                         "transactional.id": f"test-feeder-{spec.run_id}",
                         "linger.ms": 5, "message.max.bytes": topics.MAX_MESSAGE_BYTES})
    producer.init_transactions(30)
    topic = topics.completions_topic(spec.run_id)
    count = 0
    pending = 0
    producer.begin_transaction()
    for record in records:
        partition = int(record.id[1:]) % spec.partitions
        producer.produce(topic, key=record.id.encode(), value=encode_record(record),
                         partition=partition)
        count += 1
        pending += 1
        if pending >= per_transaction:
            producer.commit_transaction(30)
            pending = 0
            if with_aborted and count == per_transaction * 2:
                producer.begin_transaction()
                for p in range(spec.partitions):
                    producer.produce(topic, key=b"aborted", value=b"{not a record", partition=p)
                producer.flush(30)
                producer.abort_transaction(30)
            producer.begin_transaction()
    producer.commit_transaction(30)
    return count


def publish_done(settings: Settings, run_id: str, total: int) -> None:
    """The producer's final checkpoint, so `--until-done` knows the total."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(topics.progress_topic(run_id), key=producer_key(run_id).encode(),
                     value=encode_record(ProducerCheckpoint(run=run_id, next_seq=total,
                                                            total=total, done=True)))
    assert producer.flush(30) == 0


# -- reading back --------------------------------------------------------------


def s3_client(settings: Settings) -> Any:
    return boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")


def create_bucket(settings: Settings) -> None:
    s3_client(settings).create_bucket(Bucket=settings.s3_bucket)


@dataclass
class S3Object:
    key: str
    metadata: dict[str, str]
    lines: list[dict[str, Any]]


def s3_objects(settings: Settings, bucket: str | None = None) -> list[S3Object]:
    client = s3_client(settings)
    bucket = bucket or settings.s3_bucket
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            obj = client.get_object(Bucket=bucket, Key=item["Key"])
            data = obj["Body"].read()
            if item["Key"].endswith(".zst"):
                data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
            lines = [msgspec.json.decode(line) for line in data.splitlines() if line]
            out.append(S3Object(item["Key"], obj.get("Metadata", {}), lines))
    return out


def s3_ids(settings: Settings, bucket: str | None = None) -> list[str]:
    return [line["id"] for obj in s3_objects(settings, bucket) for line in obj.lines]


def dlq_records(settings: Settings, run_id: str) -> list[Any]:
    return read_all(settings.bootstrap_servers, topics.dlq_topic(run_id))


def assert_exactly_once(settings: Settings, run_id: str, expected_ids: set[str],
                        bucket: str | None = None) -> tuple[list[str], list[str]]:
    in_s3 = s3_ids(settings, bucket)
    in_dlq = [r.key.decode() for r in dlq_records(settings, run_id)]
    everywhere = Counter(in_s3) + Counter(in_dlq)
    duplicated = {k: v for k, v in everywhere.items() if v > 1}
    assert not duplicated, f"records written more than once: {sorted(duplicated)[:10]}"
    missing = expected_ids - set(everywhere)
    assert not missing, f"records lost: {sorted(missing)[:10]} ({len(missing)} in all)"
    assert set(everywhere) == expected_ids
    return in_s3, in_dlq


# -- the sink as a subprocess -------------------------------------------------------


def sink_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
        "TOKENMILL_S3_BUCKET": settings.s3_bucket or "",
        "TOKENMILL_LOG_FORMAT": "json",
        "PYTHONPATH": str(REPO),
    })
    env.update(extra)
    return env


def start_sink(settings: Settings, run_id: str, *args: str, log_path: Path,
               env: dict[str, str] | None = None, kill_at: str | None = None,
               faults: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """`kill_at` ("STEP:N"): die at that step of the Nth transaction;
    `faults`: more of tests/faults.py's options."""
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", *entry(kill_at, faults), "sink", "--run", run_id, *args],
        env=env or sink_env(settings), stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)


class SinkProcess(ServiceProcess):
    """`tokenmill sink` as a child process (JSON log at `log_path`); `env`
    over `sink_env(settings)`, e.g. another S3 endpoint."""

    def __init__(self, settings: Settings, run_id: str, instance: str, log_path: Path,
                 *args: str, env: dict[str, str] | None = None,
                 faults: Sequence[str] = ()) -> None:
        super().__init__([*entry(None, faults), "sink", "--run", run_id, "--instance", instance,
                          *args], log_path, sink_env(settings, **(env or {})))
        self.instance = instance


def wait(proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"sink did not exit in {timeout_s}s; log:\n"
                             f"{log_path.read_text()[-4000:]}") from None


def wait_for(predicate: Any, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)  # poll of a wait loop
    raise AssertionError(f"{what} not reached in {timeout_s}s")


def make_service(settings: Settings, spec: RunSpec, *, instance: str = "inproc",
                 batch_size: int = 500, max_batch_age_s: float = 600.0,
                 max_batch_bytes: int = 64 * 1024 * 1024, compression: str | None = None,
                 s3_client: Any = None, service_class: Any = None, **config: Any) -> Any:
    """A SinkService with `until_done`, short session and done-check intervals."""
    from sink.batcher import BatchLimits
    from sink.config import resolve
    from sink.service import SinkService

    sink_config = resolve(
        settings, spec, instance=instance, compression=compression,  # type: ignore[arg-type]
        create_bucket=True,
        limits=BatchLimits(max_records=batch_size, max_bytes=max_batch_bytes,
                           max_age_s=max_batch_age_s),
        until_done=True, session_timeout_s=config.pop("session_timeout_s", 6.0),
        done_check_interval_s=config.pop("done_check_interval_s", 0.5), **config)
    return (service_class or SinkService)(settings=settings, spec=spec, config=sink_config,
                                          s3_client=s3_client)


class ServiceThread:
    """Runs a service's `run()` in a thread (no signal handlers)."""

    def __init__(self, service: Any) -> None:
        import threading

        self.service = service
        self.result: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._target, daemon=True)
        self.thread.start()

    def _target(self) -> None:
        try:
            self.result["code"] = self.service.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            self.result["error"] = exc

    def join(self, timeout_s: float) -> Any:
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.service.stop()
            self.thread.join(30)
            raise AssertionError(f"sink did not finish within {timeout_s}s")
        if "error" in self.result:
            raise self.result["error"]
        assert self.result["code"] == 0
        return self.service


def run_sink_in_process(settings: Settings, spec: RunSpec, *, timeout_s: float = 60.0,
                        **kwargs: Any) -> Any:
    """Run a SinkService with `until_done` in this process until it exits;
    returns the service. Fails if it does not finish in time."""
    return ServiceThread(make_service(settings, spec, **kwargs)).join(timeout_s)
