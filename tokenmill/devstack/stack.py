"""Bring the dev stack up and down, and say what runs where.

State lives in `<state_dir>/stack.json`; every process runs in its own
session so `down` can stop the whole group and leave nothing behind.
"""

from __future__ import annotations

import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import msgspec

from tokenmill import kafka_clients
from tokenmill.devstack import kafka_broker, processes, s3_server
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.devstack")

DEFAULT_BUCKET = "tokenmill"


class ServiceState(msgspec.Struct):
    pid: int
    address: str
    log: str


class StackState(msgspec.Struct):
    kafka: ServiceState
    s3: ServiceState
    bucket: str
    started_at: float

    def env(self) -> dict[str, str]:
        return {
            "TOKENMILL_BOOTSTRAP_SERVERS": self.kafka.address,
            "TOKENMILL_S3_ENDPOINT_URL": self.s3.address,
            "TOKENMILL_S3_BUCKET": self.bucket,
            "AWS_ACCESS_KEY_ID": s3_server.DEV_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": s3_server.DEV_SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
        }


class StackError(RuntimeError):
    """The dev stack could not be started."""


@dataclass(frozen=True)
class StackPlan:
    state_dir: Path
    host: str = "127.0.0.1"
    kafka_port: int = 9092
    controller_port: int = 9093
    s3_port: int = 9000
    bucket: str = DEFAULT_BUCKET
    kafka_heap: str = "1g"
    timeout_s: float = 120.0

    @classmethod
    def on_free_ports(cls, state_dir: Path, **options: Any) -> StackPlan:
        """A private stack (tests, benchmarks, the demo) beside whatever else
        runs: every port picked free."""
        return cls(state_dir=state_dir, kafka_port=processes.free_port(),
                   controller_port=processes.free_port(), s3_port=processes.free_port(),
                   **options)


def state_path(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def read_state(state_dir: Path) -> StackState | None:
    path = state_path(state_dir)
    if not path.is_file():
        return None
    return msgspec.json.decode(path.read_bytes(), type=StackState)


def running(state: StackState) -> dict[str, bool]:
    return {"kafka": processes.alive(state.kafka.pid), "s3": processes.alive(state.s3.pid)}


def up(plan: StackPlan) -> tuple[StackState, bool]:
    """Start the stack; returns (state, started). Already running: no-op."""
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    existing = read_state(plan.state_dir)
    if existing is not None:
        if all(running(existing).values()):
            return existing, False
        down(plan.state_dir)  # half-dead: clear it and start clean
    processes.require_free(plan.host, plan.kafka_port, "Kafka", "--kafka-port")
    processes.require_free(plan.host, plan.controller_port, "the Kafka controller",
                           "--controller-port")
    processes.require_free(plan.host, plan.s3_port, "the S3 server", "--s3-port")

    lib = kafka_broker.fetch_jars()
    broker = kafka_broker.BrokerPlan(
        home=plan.state_dir / "kafka", host=plan.host, kafka_port=plan.kafka_port,
        controller_port=plan.controller_port, heap=plan.kafka_heap,
    )
    kafka_broker.prepare(broker, lib)
    kafka_pid = kafka_broker.start(broker, lib)
    s3_pid = s3_server.start(plan.host, plan.s3_port, plan.state_dir / "logs")
    state = StackState(
        kafka=ServiceState(kafka_pid, broker.bootstrap, str(broker.logs_dir / "broker.out")),
        s3=ServiceState(s3_pid, f"http://{plan.host}:{plan.s3_port}",
                        str(plan.state_dir / "logs" / "s3.out")),
        bucket=plan.bucket,
        started_at=time.time(),
    )
    state_path(plan.state_dir).write_bytes(msgspec.json.encode(state))
    try:
        _wait_for_s3(state, plan.timeout_s)
        _wait_for_kafka(state, plan.timeout_s)
        _ensure_bucket(state)
    except BaseException:
        down(plan.state_dir)
        raise
    return state, True


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for_kafka(state: StackState, timeout_s: float) -> None:
    settings = Settings(bootstrap_servers=state.kafka.address, connect_timeout_s=2.0)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not processes.alive(state.kafka.pid):
            raise StackError(f"the Kafka broker exited during start-up; last log lines:\n"
                             f"{_tail(state.kafka.log)}")
        if processes.port_open(*_host_port(state.kafka.address)):
            try:
                kafka_clients.check_broker(settings, timeout_s=2.0)
                return
            except kafka_clients.BrokerUnreachable:
                pass
        time.sleep(0.5)
    raise StackError(f"Kafka did not answer at {state.kafka.address} within {timeout_s:.0f}s; "
                     f"log: {state.kafka.log}\n{_tail(state.kafka.log)}")


def _wait_for_s3(state: StackState, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not processes.alive(state.s3.pid):
            raise StackError(f"the S3 server exited during start-up:\n{_tail(state.s3.log)}")
        try:
            with urllib.request.urlopen(state.s3.address + "/", timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise StackError(f"the S3 server did not answer at {state.s3.address} within {timeout_s:.0f}s")


def _ensure_bucket(state: StackState) -> None:
    client = boto3.client(
        "s3", endpoint_url=state.s3.address, region_name="us-east-1",
        aws_access_key_id=s3_server.DEV_ACCESS_KEY,
        aws_secret_access_key=s3_server.DEV_SECRET_KEY,
    )
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if state.bucket not in existing:
        client.create_bucket(Bucket=state.bucket)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def down(state_dir: Path) -> list[str]:
    """Stop every process of the stack; returns what was stopped."""
    state = read_state(state_dir)
    if state is None:
        return []
    stopped = []
    for name, service in (("s3", state.s3), ("kafka", state.kafka)):
        if processes.alive(service.pid):
            processes.stop(service.pid)
            stopped.append(name)
    state_path(state_dir).unlink(missing_ok=True)
    return stopped
