"""`tokenmill dev up|status|down` as a user runs them, in a state directory
of their own and on free ports (the session's stack keeps running)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import boto3
import msgspec
import pytest
from kafka import KafkaAdminClient

from devstack import processes

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def tokenmill(*args: str, env: dict[str, str] | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess[str]:
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
        pids = list(_pids(state).values())
        assert len(pids) == 2

        again = tokenmill("dev", "up", "--state-dir", state, "--kafka-port", str(ports[0]),
                          "--controller-port", str(ports[1]), "--s3-port", str(ports[2]))
        assert again.returncode == 0 and "already running" in again.stderr
    finally:
        down = tokenmill("dev", "down", "--state-dir", state)
    assert down.returncode == 0
    assert pids and not any(processes.group_alive(pid) for pid in pids)
    assert processes.port_free("127.0.0.1", ports[0])
    assert tokenmill("dev", "status", "--state-dir", state).returncode == 1


def _pids(state_dir: str) -> dict[str, int]:
    saved = msgspec.json.decode((Path(state_dir) / "stack.json").read_bytes())
    return {service["name"]: service["pid"] for service in [*saved["brokers"], saved["s3"]]}


def test_up_on_a_half_running_three_broker_stack_restarts_only_what_is_down(
        tmp_path: Path) -> None:
    kafka_port = _free_run(6)  # the default layout: 9092/9093, 9094/9095, 9096/9097
    controller_port = kafka_port + 1
    s3_port = processes.free_port()
    seen: set[int] = set()
    state = str(tmp_path / "state")
    flags = ["--state-dir", state, "--brokers", "3", "--kafka-port", str(kafka_port),
             "--controller-port", str(controller_port), "--s3-port", str(s3_port),
             "--kafka-heap", "512m"]
    up = tokenmill("dev", "up", *flags)
    try:
        assert up.returncode == 0, up.stderr
        env = _exports(up.stdout)
        # Node i on --kafka-port + 2i.
        assert env["TOKENMILL_BOOTSTRAP_SERVERS"] == ",".join(
            f"127.0.0.1:{kafka_port + 2 * i}" for i in range(3))
        admin = KafkaAdminClient(bootstrap_servers=env["TOKENMILL_BOOTSTRAP_SERVERS"].split(","))
        assert sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"]) == [1, 2, 3]
        admin.close()
        s3 = boto3.client("s3", endpoint_url=env["TOKENMILL_S3_ENDPOINT_URL"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          region_name="us-east-1")
        s3.put_object(Bucket=env["TOKENMILL_S3_BUCKET"], Key="kept", Body=b"still here")
        before = _pids(state)
        seen.update(before.values())

        # A broker dies: `dev up` restarts that one, the S3 server and its
        # objects stay as they are.
        processes.signal_group(before["kafka-2"], signal.SIGKILL)
        assert processes.wait_gone(before["kafka-2"], 30)
        status = tokenmill("dev", "status", "--state-dir", state)
        assert status.returncode == 1 and "down" in status.stdout
        # Its port taken by a stranger meanwhile: refused in one line, nothing replaced.
        with socket.socket() as stranger:
            stranger.bind(("127.0.0.1", kafka_port + 2))
            stranger.listen()
            blocked = tokenmill("dev", "up", *flags)
        assert blocked.returncode == 1 and "Traceback" not in blocked.stderr
        assert f"kafka-2 is down and its port {kafka_port + 2}" in " ".join(blocked.stderr.split())
        assert {k: v for k, v in _pids(state).items() if k != "kafka-2"} == \
            {k: v for k, v in before.items() if k != "kafka-2"}
        again = tokenmill("dev", "up", *flags)
        assert again.returncode == 0, again.stderr
        assert "restarted kafka-2" in " ".join(again.stderr.split())
        after = _pids(state)
        seen.update(after.values())
        assert after["kafka-2"] != before["kafka-2"]
        assert {k: v for k, v in after.items() if k != "kafka-2"} == \
            {k: v for k, v in before.items() if k != "kafka-2"}
        body = s3.get_object(Bucket=env["TOKENMILL_S3_BUCKET"], Key="kept")["Body"].read()
        assert body == b"still here"
        admin = KafkaAdminClient(bootstrap_servers=env["TOKENMILL_BOOTSTRAP_SERVERS"].split(","))
        assert sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"]) == [1, 2, 3]
        admin.close()

        # Everything up: nothing is restarted.
        same = tokenmill("dev", "up", *flags)
        assert same.returncode == 0 and "already running" in same.stderr
        assert _pids(state) == after

        # The S3 server dies: only it is started again (empty: moto keeps
        # objects in memory); the brokers keep running.
        processes.signal_group(after["s3"], signal.SIGKILL)
        assert processes.wait_gone(after["s3"], 30)
        third = tokenmill("dev", "up", *flags)
        assert third.returncode == 0, third.stderr
        final = _pids(state)
        seen.update(final.values())
        assert final["s3"] != after["s3"]
        assert {k: v for k, v in final.items() if k != "s3"} == \
            {k: v for k, v in after.items() if k != "s3"}
        assert env["TOKENMILL_S3_BUCKET"] in {
            b["Name"] for b in s3.list_buckets()["Buckets"]}

        # A different broker count is refused while this stack is set up.
        other = tokenmill("dev", "up", "--state-dir", state, "--brokers", "1")
        assert other.returncode == 1 and "3-broker stack" in other.stderr
        assert "Traceback" not in other.stderr
    finally:
        down = tokenmill("dev", "down", "--state-dir", state)
    assert down.returncode == 0
    assert len(seen) == 6 and not any(processes.group_alive(pid) for pid in seen)


def _free_run(length: int) -> int:
    """A port p such that p .. p+length-1 are all free."""
    for _ in range(200):
        start = processes.free_port()
        if start + length < 65535 and all(processes.port_free("127.0.0.1", start + i)
                                           for i in range(length)):
            return start
    raise RuntimeError("no run of free ports")


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


def test_a_process_is_recognised_by_its_command_line_right_after_it_starts(tmp_path: Path) -> None:
    # Just after Popen returns, /proc/<pid>/cmdline can still be empty (the
    # kernel finishes exec after the parent is told it succeeded); a fresh
    # broker must never be taken for a stranger (`dev down` would leave it).
    argv = ["sleep", "30"]
    for _ in range(30):  # before the fix about half the starts were missed
        pid = processes.spawn(argv, tmp_path / "sleep.log")
        try:
            assert processes.running_as(pid, argv)
            assert not processes.running_as(pid, ["sleep", "31"])
        finally:
            processes.stop(pid, 2)
        assert not processes.running_as(pid, argv)


def test_up_with_the_real_s3_server_repairs_it_keeping_its_objects(tmp_path: Path) -> None:
    """`dev up --s3 ceph`: Ceph's S3 gateway on a one-node cluster; its OSD
    and gateway killed (-9), `dev up` restarts just them on the same data and
    the objects are still there; `dev down` leaves nothing."""
    ports = [processes.free_port() for _ in range(3)]
    state = str(tmp_path / "state")
    args = ("dev", "up", "--state-dir", state, "--kafka-port", str(ports[0]),
            "--controller-port", str(ports[1]), "--s3-port", str(ports[2]),
            "--kafka-heap", "512m", "--s3", "ceph")
    up = tokenmill(*args)
    assert up.returncode == 0, up.stderr
    assert "S3 (ceph)" in up.stderr
    env = _exports(up.stdout)
    saved = msgspec.json.decode((Path(state) / "stack.json").read_bytes())
    pids = {s["name"]: s["pid"] for s in [*saved["brokers"], *saved["s3_cluster"], saved["s3"]]}
    try:
        assert set(pids) == {"kafka-1", "ceph-mon", "ceph-osd", "s3"}
        s3 = boto3.client("s3", endpoint_url=env["TOKENMILL_S3_ENDPOINT_URL"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          region_name="us-east-1")
        s3.put_object(Bucket=env["TOKENMILL_S3_BUCKET"], Key="k", Body=b"kept")
        for name in ("ceph-osd", "s3"):
            processes.signal_group(pids[name], signal.SIGKILL)
            assert processes.wait_gone(pids[name], 30)
        assert tokenmill("dev", "status", "--state-dir", state).returncode == 1
        again = tokenmill(*args)
        assert again.returncode == 0, again.stderr
        assert "restarted ceph-osd, s3" in " ".join(again.stderr.split())
        got = s3.get_object(Bucket=env["TOKENMILL_S3_BUCKET"], Key="k")["Body"].read()
        assert got == b"kept"
        moto = tokenmill("dev", "up", "--state-dir", state, "--s3", "moto")
        assert moto.returncode == 1 and "to change --s3" in moto.stderr
        saved = msgspec.json.decode((Path(state) / "stack.json").read_bytes())
        pids = {s["name"]: s["pid"]
                for s in [*saved["brokers"], *saved["s3_cluster"], saved["s3"]]}
    finally:
        down = tokenmill("dev", "down", "--state-dir", state)
    assert down.returncode == 0
    assert not any(processes.group_alive(pid) for pid in pids.values())
