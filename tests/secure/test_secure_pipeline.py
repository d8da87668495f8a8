"""The pipeline exactly once on the secured broker under least privilege:
`tokenmill deploy acls --run RUN --apply` (as `admin`, who may only manage
ACLs) grants the run's ACLs, and nothing else is granted; the producer, two
workers and the sink then run as their own principals (`producer`, `worker`,
`sink`), the reader's commands as `reader`, and no process logs in as a
super user. Checked with kafka-python (logged in as `reader`) and boto3:
every published prompt is in exactly one place, one S3 line or one DLQ
record; and no password appears in any output or log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import boto3
import pytest

from devstack.processes import free_port
from sglang_sim import SimulatorConfig
from sglang_sim.runner import SimulatorProcess
from tests.kafka_helpers import read_all
from tests.secure.conftest import ROLES, SecureServices
from tokenmill.kafka import topics

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

PROMPTS = 300


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tokenmill.cli", *args]


def write_prompts(path: Path, n: int) -> Path:
    with path.open("w") as out:
        for i in range(n):
            out.write(json.dumps({"messages": [{"role": "user",
                                                "content": f"Explain idea {i}."}]}) + "\n")
    return path


class Process:
    """A `tokenmill` command running as one role, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name, self.args, self.env = name, args, env
        self.log = logs / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env)
        return self

    def wait(self, timeout: float) -> int:
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


def s3_ids(endpoint: str, bucket: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    ids = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            ids += [json.loads(line)["id"] for line in body.splitlines() if line.strip()]
    return ids


class SecuredRun:
    """One run on the secured broker: its environment per role, its logs."""

    def __init__(self, services: SecureServices, tmp_path: Path) -> None:
        self.services = services
        self.run_id = f"t{uuid.uuid4().hex[:12]}"
        self.bucket = services.new_bucket()
        self.logs = tmp_path / "logs"
        self.logs.mkdir()
        self.state_dir = tmp_path / "state"
        self.common = {"TOKENMILL_S3_BUCKET": self.bucket, "TOKENMILL_LOG_FORMAT": "json",
                       "TOKENMILL_STATE_DIR": str(self.state_dir),
                       "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}

    def env(self, role: str) -> dict[str, str]:
        return self.services.env(role, **self.common)

    def run(self, role: str, *args: str, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        """A command as `role`, to its end; its output kept with the logs."""
        result = subprocess.run(cli(*args), env=self.env(role), capture_output=True, text=True,
                                timeout=timeout)
        (self.logs / f"{role}-{args[0]}-{uuid.uuid4().hex[:6]}.log").write_text(
            result.stdout + result.stderr)
        assert result.returncode == 0, (args, result.stderr[-3000:])
        return result

    def process(self, name: str, role: str, *args: str) -> Process:
        return Process(name, cli(*args), self.env(role), self.logs)

    def wait_for_the_workers_group(self, workers: list[Process], timeout_s: float = 120) -> None:
        """`status` as reader shows the workers' group while they work
        (KIP-848: describing a group takes DESCRIBE on its topic, which is
        all the reader has of the prompts)."""
        deadline = time.monotonic() + timeout_s
        while True:
            group = json.loads(self.run("reader", "status", "--run", self.run_id,
                                        "--json").stdout)["group"]
            if group and group["workers"]:
                return
            assert time.monotonic() < deadline and all(
                w.proc is not None and w.proc.poll() is None for w in workers), \
                f"status never showed the workers' group: {group}"
            time.sleep(0.5)  # poll of a wait loop

    def check_exactly_once(self) -> None:
        """Every prompt in exactly one place, read by kafka-python (as the
        producer for the prompts, the reader for the DLQ) and boto3."""
        published = [r.key.decode() for r in read_all(
            self.services.bootstrap, topics.prompts_topic(self.run_id),
            security=self.services.kafka_python("producer"))]
        assert len(published) == len(set(published)) == PROMPTS
        in_s3 = s3_ids(self.services.state.s3.address, self.bucket)
        in_dlq = [json.loads(r.value)["id"] for r in read_all(
            self.services.bootstrap, topics.dlq_topic(self.run_id),
            security=self.services.kafka_python("reader"))]
        everything = Counter(in_s3) + Counter(in_dlq)
        assert [k for k, v in everything.items() if v > 1] == []
        assert set(everything) == set(published)
        assert in_s3 and in_dlq  # both destinations were used

    def check_no_secret_anywhere(self) -> None:
        secrets_ = {self.services.password(role) for role in ROLES}
        files = [*self.logs.iterdir(), *(p for p in self.state_dir.rglob("*") if p.is_file())]
        for path in files:
            text = path.read_text(errors="replace")
            assert not [s for s in secrets_ if s in text], path


def test_pipeline_exactly_once_with_each_role_its_own_principal_and_only_its_acls(
        secure_services: SecureServices, tmp_path: Path) -> None:
    run = SecuredRun(secure_services, tmp_path)
    # The run's ACLs, exactly as `deploy acls` prints them, created by admin.
    assert "created" in run.run("admin", "deploy", "acls", "--run", run.run_id,
                                "--apply").stderr
    run.run("producer", "produce", str(write_prompts(tmp_path / "chat.jsonl", PROMPTS)),
            "--run", run.run_id, "--gpus", "2", "--partitions-per-gpu", "2",
            "--max-tokens", "4096", "--no-progress", timeout=300)

    config = SimulatorConfig(time_scale=100, decode_rate=60.0, max_running_requests=64,
                             prefill_rate=0, error_rate=0.02, empty_rate=0.02)
    sims = [SimulatorProcess(config, port=free_port()) for _ in range(2)]
    workers = [run.process(f"worker{i}", "worker", "consume", "--run", run.run_id,
                           "--sglang-url", sim.start(), "--instance", f"w{i}", "--until-done",
                           "--concurrency", "24", "--commit-interval", "0.5",
                           "--session-timeout", "6", "--max-attempts", "2", "--retry-base", "0.05")
               for i, sim in enumerate(sims)]
    sink = run.process("sink", "sink", "sink", "--run", run.run_id, "--instance", "s0",
                       "--until-done", "--batch-size", "50", "--max-batch-age", "1",
                       "--session-timeout", "6")
    try:
        for service in (*workers, sink):
            service.start()
        run.wait_for_the_workers_group(workers)
        for service in (*workers, sink):
            assert service.wait(300) == 0, service.tail()
    finally:
        for service in (*workers, sink):
            service.stop()
        for sim in sims:
            sim.terminate()

    # The reader's commands, side by side.
    readers = [run.process(f"reader-{args[0]}", "reader", *args) for args in (
        ("status", "--run", run.run_id, "--json"), ("spot-check", "--run", run.run_id, "-n", "2"),
        ("dataset", run.run_id, "--json"),
        ("export", run.run_id, "--format", "openai", "--out", str(tmp_path / "export")))]
    for reader in readers:
        reader.start()
    for reader in readers:
        assert reader.wait(180) == 0, reader.tail()
    status = json.loads(next(line for line in readers[0].log.read_text().splitlines()
                             if line.startswith("{") and '"run"' in line))
    assert status["persisted"] == status["total"] == PROMPTS, status

    run.check_exactly_once()
    run.check_no_secret_anywhere()
