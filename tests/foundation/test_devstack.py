"""`tokenmill dev up|status|down` as a user runs them, in a state directory
of their own and on free ports (the session's stack keeps running)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import pytest
from kafka import KafkaAdminClient

from tokenmill.devstack import processes

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def tokenmill(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _exports(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            out[key] = value.strip("'")
    return out


def test_up_status_down_leaves_nothing(tmp_path: Path) -> None:
    ports = [processes.free_port() for _ in range(3)]
    state = str(tmp_path / "state")
    up = tokenmill("dev", "up", "--state-dir", state, "--kafka-port", str(ports[0]),
                   "--controller-port", str(ports[1]), "--s3-port", str(ports[2]),
                   "--kafka-heap", "512m")
    assert up.returncode == 0, up.stderr
    env = _exports(up.stdout)
    assert env["TOKENMILL_BOOTSTRAP_SERVERS"] == f"127.0.0.1:{ports[0]}"
    pids = []
    try:
        admin = KafkaAdminClient(bootstrap_servers=env["TOKENMILL_BOOTSTRAP_SERVERS"])
        assert admin.describe_cluster()["cluster_id"]
        assert admin._client.check_version() >= (3, 0)
        admin.close()

        s3 = boto3.client("s3", endpoint_url=env["TOKENMILL_S3_ENDPOINT_URL"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          region_name="us-east-1")
        bucket = f"b-{uuid.uuid4().hex[:8]}"
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="k", Body=b"hello")
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"hello"

        status = tokenmill("dev", "status", "--state-dir", state)
        assert status.returncode == 0
        assert "kafka" in status.stdout and "up" in status.stdout
        import msgspec
        saved = msgspec.json.decode((Path(state) / "stack.json").read_bytes())
        pids = [saved["kafka"]["pid"], saved["s3"]["pid"]]

        again = tokenmill("dev", "up", "--state-dir", state, "--kafka-port", str(ports[0]),
                          "--controller-port", str(ports[1]), "--s3-port", str(ports[2]))
        assert again.returncode == 0 and "already running" in again.stderr
    finally:
        down = tokenmill("dev", "down", "--state-dir", state)
    assert down.returncode == 0
    assert pids and not any(processes.group_alive(pid) for pid in pids)
    assert processes.port_free("127.0.0.1", ports[0])
    assert tokenmill("dev", "status", "--state-dir", state).returncode == 1


def test_up_names_a_taken_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tokenmill("dev", "up", "--state-dir", str(tmp_path), "--kafka-port", str(port),
                           "--controller-port", str(processes.free_port()),
                           "--s3-port", str(processes.free_port()))
    assert result.returncode != 0
    assert f"port {port}" in result.stderr
    assert "--kafka-port" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_broker_fails_fast_naming_the_address() -> None:
    # The same command refused before it connects: its start-up on this
    # machine, now (a loaded 2-core machine can take seconds to import).
    started = time.monotonic()
    refused = tokenmill("runs", "list", "--bootstrap-servers", "no-port", timeout=120)
    startup = time.monotonic() - started
    assert refused.returncode != 0 and "--bootstrap-servers" in refused.stderr

    port = processes.free_port()
    started = time.monotonic()
    result = tokenmill("runs", "list", "--bootstrap-servers", f"127.0.0.1:{port}",
                       "--connect-timeout-s", "5", timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr
    assert "cannot reach Kafka" in result.stderr
    assert "Traceback" not in result.stderr
    # bounded by the connect timeout, not by librdkafka's own retries
    assert elapsed - startup < 5 + 10, (elapsed, startup)
