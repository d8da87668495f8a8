"""Guarantee 3 end to end: producer -> 3 consumers -> sink, against a real
broker, an S3 server and simulators with faults, with a consumer and the sink
killed (-9) and restarted mid-run. The union of S3 lines and DLQ records must
equal the set of published prompt ids exactly, with no id twice. Checked
with kafka-python and plain boto3, which share no code with tokenmill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import boto3
import pytest
import zstandard

from devstack.processes import free_port
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.kafka_helpers import read_all

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
                                         "parameters": {"type": "object", "properties": {
                                             "word": {"type": "string"}}}}}


def write_dataset(directory: Path, n: int) -> list[Path]:
    openai_path = directory / "chat.jsonl"
    sharegpt_path = directory / "sharegpt.jsonl"
    tools_path = directory / "tools.jsonl"
    with openai_path.open("w") as f:
        for i in range(n):
            f.write(json.dumps(
                {"messages": [{"role": "user", "content": f"Explain idea {i}."}]}) + "\n")
    with sharegpt_path.open("w") as f:
        for i in range(n // 4):
            f.write(json.dumps({"conversations": [
                {"from": "human", "value": f"Tell me about place {i}."},
                {"from": "gpt", "value": "It is nice."},
                {"from": "human", "value": f"And its history {i}?"}]}) + "\n")
    with tools_path.open("w") as f:
        for i in range(n // 4):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Define word {i}."}],
                                "tools": [TOOL]}) + "\n")
    return [openai_path, sharegpt_path, tools_path]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", *args]


class Service:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.args, self.env = name, args, env
        self.log = logs / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def wait(self, timeout: float) -> int:
        """Its exit code; still running after `timeout` fails with its log's tail."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout:.0f}s; its log "
                                 f"ends:\n{self.tail()}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _committed(settings, run_id: str) -> int:
    """Records committed in `.completions` so far (read_committed end offsets
    minus transaction markers are not countable: count the records)."""
    return len(read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.completions"))


def s3_keys(settings) -> list[str]:
    """The batch objects (not the sink's start-up check's scratch key)."""
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    return [item["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
        Bucket=settings.s3_bucket) for item in page.get("Contents", [])
        if "/partition=" in item["Key"]]


def s3_ids(settings, run_id: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    ids = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.s3_bucket):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=settings.s3_bucket, Key=item["Key"])["Body"].read()
            if item["Key"].endswith(".zst"):
                body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
            for line in body.splitlines():
                if line.strip():
                    ids.append(json.loads(line)["id"])
    return ids


def test_end_to_end_exactly_once_with_crashes(settings, services, run_id, tmp_path) -> None:
    boto3.client("s3", endpoint_url=settings.s3_endpoint_url,
                 region_name="us-east-1").create_bucket(Bucket=settings.s3_bucket)
    env = {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url,
           "TOKENMILL_S3_BUCKET": settings.s3_bucket, "TOKENMILL_LOG_FORMAT": "json",
           "TOKENMILL_STATE_DIR": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    files = write_dataset(tmp_path, 1200)
    produced = subprocess.run(cli("produce", *map(str, files), "--run", run_id, "--gpus", "3",
                                  "--partitions-per-gpu", "2", "--max-tokens", "4096",
                                  "--no-progress"),
                              env=env, capture_output=True, text=True, timeout=300)
    assert produced.returncode == 0, produced.stderr[-3000:]

    # ~2% errors, ~15-18% length-capped at 4096 tokens, ~1% empty answers.
    faulty = SimulatorConfig(time_scale=100, decode_rate=60.0, max_running_requests=64,
                             prefill_rate=0, error_rate=0.02, empty_rate=0.01,
                             tool_call_parser="qwen25")
    sims = [SimulatorProcess(faulty, port=free_port()) for _ in range(3)]
    urls = [sim.start() for sim in sims]
    consumers = [Service(f"consumer{i}", cli("consume", "--run", run_id, "--sglang-url", url,
                                             "--instance", f"c{i}", "--until-done",
                                             "--concurrency", "24", "--commit-interval", "0.5",
                                             "--session-timeout", "6", "--max-attempts", "2",
                                             "--retry-base", "0.05"), env, tmp_path)
                 for i, url in enumerate(urls)]
    sink = Service("sink", cli("sink", "--run", run_id, "--instance", "s0", "--until-done",
                               "--batch-size", "100", "--max-batch-age", "1",
                               "--session-timeout", "6"), env, tmp_path)
    total = 1200 + 300 + 300
    try:
        for service in (*consumers, sink):
            service.start()
        # The kills land mid-run by construction: once completions are
        # committed and an S3 object is written, the simulated GPUs are frozen
        # (SIGSTOP) with the run unfinished, so it cannot end before the kills
        # however slow the checks are (ci37 beside a busy core: a check that
        # saw the run unfinished was stale by the kill, and all 1800 were in).
        deadline = time.monotonic() + 180
        while not (_committed(settings, run_id) > 0 and s3_keys(settings)):
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.2)  # poll of a wait loop
        for sim in sims:
            os.kill(sim.proc.pid, signal.SIGSTOP)
        try:
            frozen_at = _committed(settings, run_id), len(s3_keys(settings))
            assert 0 < frozen_at[0] < total and frozen_at[1] >= 1, frozen_at
            consumers[1].kill()
            sink.kill()
            consumers[1].start()
            sink.start()
        finally:
            for sim in sims:
                os.kill(sim.proc.pid, signal.SIGCONT)
        for service in consumers:
            assert service.wait(300) == 0, service.tail()
        assert sink.wait(300) == 0, sink.tail()
    finally:
        for service in (*consumers, sink):
            service.stop()
        for sim in sims:
            sim.terminate()

    published = [r.key.decode() for r in
                 read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.prompts")]
    assert len(published) == len(set(published)) == total
    in_s3 = s3_ids(settings, run_id)
    dlq = read_all(settings.bootstrap_servers, f"tokenmill.{run_id}.dlq")
    in_dlq = [json.loads(r.value)["id"] for r in dlq]
    everything = Counter(in_s3) + Counter(in_dlq)
    assert [k for k, v in everything.items() if v > 1] == []
    assert set(everything) == set(published)
    reasons = Counter(dict(r.headers)["tokenmill.dlq.reason"].decode() for r in dlq)
    assert reasons["length"] > 0.05 * len(published)
    assert reasons["empty"] > 0
