"""A stack of one's own for fault tests: one or three Kafka brokers and an S3
server on free ports in a directory of its own, with each broker node under
the test's control (SIGKILL, clean stop, restart on the same data).

    with PrivateStack(tmp_path, brokers=3) as stack:
        node = stack.broker(2)
        node.kill()              # SIGKILL, like a crashed host
        node.start()             # the same command line, the same data dir
        node.wait_ready()
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec

from devstack import kafka_broker, processes, secure, stack
from tokenmill.settings import Secret, Settings


class BrokerNode:
    """One broker of a running private stack, addressed by its node id."""

    def __init__(self, owner: PrivateStack, node_id: int) -> None:
        self._owner = owner
        self.node_id = node_id

    def _service(self) -> stack.ServiceState:
        return self._owner.state.brokers[self.node_id - 1]

    @property
    def pid(self) -> int:
        return self._service().pid

    @property
    def address(self) -> str:
        return self._service().address

    @property
    def log_path(self) -> Path:
        return Path(self._service().log)

    def is_running(self) -> bool:
        return stack.is_running(self._service())

    def kill(self, timeout_s: float = 30.0) -> None:
        """SIGKILL the broker and wait until it is gone."""
        processes.signal_group(self.pid, signal.SIGKILL)
        if not processes.wait_gone(self.pid, timeout_s):
            raise TimeoutError(f"broker {self.node_id} (pid {self.pid}) survived SIGKILL "
                               f"for {timeout_s:.0f}s")

    def stop(self, timeout_s: float = 120.0) -> None:
        """Clean shutdown: SIGTERM, then wait for the broker to exit. One that
        does not exit in time is killed, and that is an error."""
        processes.signal_group(self.pid, signal.SIGTERM)
        if not processes.wait_gone(self.pid, timeout_s):
            self.kill()
            raise TimeoutError(f"broker {self.node_id} did not stop within {timeout_s:.0f}s of "
                               f"SIGTERM and was killed; log: {self.log_path}")

    def start(self, port_timeout_s: float = 30.0) -> None:
        """Start it again: the same command line on the same data dir. Returns
        once the process runs; `wait_ready` waits for the cluster to see it."""
        service = self._service()
        if self.is_running():
            raise RuntimeError(f"broker {self.node_id} is running already (pid {service.pid})")
        host = service.address.rpartition(":")[0]
        deadline = time.monotonic() + port_timeout_s
        while not all(processes.port_free(host, port) for port in service.ports):
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker {self.node_id}'s ports {service.ports} are still "
                                   f"taken after {port_timeout_s:.0f}s")
            time.sleep(0.2)
        self._owner.replace_broker(self.node_id, kafka_broker.start(service.argv, self.log_path))

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the broker listens and the cluster reports it up."""
        stack.wait_for_brokers([self._service()], timeout_s, bootstrap=self._owner.bootstrap,
                               client_config=secure.admin_config(self._owner.state.security))


class PrivateStack:
    """Brokers (1 or 3, KRaft combined nodes) and an S3 server in `state_dir`,
    on free ports, stopped by `down` (or leaving the `with` block)."""

    def __init__(self, state_dir: Path, *, brokers: int = 1, kafka_heap: str = "512m",
                 timeout_s: float = 180.0, secure: bool = False, quick_jvm: bool = True) -> None:
        if brokers not in (1, 3):
            raise ValueError("a private stack has 1 or 3 brokers")
        self.plan = stack.StackPlan.on_free_ports(state_dir, brokers=brokers,
                                                  kafka_heap=kafka_heap, timeout_s=timeout_s,
                                                  secure=secure, quick_jvm=quick_jvm)
        self._state: stack.StackState | None = None

    def up(self) -> Self:
        self._state, _ = stack.up(self.plan)
        return self

    def down(self) -> list[str]:
        self._state = None
        return stack.down(self.plan.state_dir)

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.down()

    @property
    def state(self) -> stack.StackState:
        if self._state is None:
            raise RuntimeError("the private stack is not up")
        return self._state

    @property
    def bootstrap(self) -> str:
        """Every broker: clients keep working while some of them are down."""
        return self.state.bootstrap

    @property
    def s3_endpoint_url(self) -> str:
        return self.state.s3.address

    @property
    def bucket(self) -> str:
        return self.state.bucket

    @property
    def brokers(self) -> list[BrokerNode]:
        return [BrokerNode(self, i + 1) for i in range(len(self.state.brokers))]

    def broker(self, node_id: int) -> BrokerNode:
        if not 1 <= node_id <= len(self.state.brokers):
            raise KeyError(f"no broker {node_id}; node ids are 1..{len(self.state.brokers)}")
        return BrokerNode(self, node_id)

    def env(self) -> dict[str, str]:
        """TOKENMILL_* and AWS_* variables for `tokenmill` child processes."""
        return self.state.env()

    def settings(self, role: str | None = None, **overrides: Any) -> Settings:
        """Settings for this stack; on a secured one, logged in as `role`
        (producer, worker, sink, reader, admin)."""
        values: dict[str, Any] = {"bootstrap_servers": self.bootstrap,
                                  "s3_endpoint_url": self.s3_endpoint_url,
                                  "s3_bucket": self.bucket, "state_dir": self.plan.state_dir}
        security = self.state.security
        if security is not None:
            if role is None:
                raise ValueError("a secured stack's settings need a role")
            values.update(security_protocol="SASL_SSL", sasl_mechanism=security.mechanism,
                          sasl_username=role,
                          sasl_password=Secret(secure.password(security, role)),
                          ssl_ca_location=security.ca_location)
        values.update(overrides)
        return Settings(**values)

    def role_env(self, role: str) -> dict[str, str]:
        """`env()` logged in as `role` (a secured stack)."""
        if self.state.security is None:
            raise RuntimeError("the stack is not secured: it has no roles")
        return {**self.env(), **secure.role_env(self.state.security, role)}

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until every broker runs and the cluster reports all of them up."""
        stack.wait_for_brokers(self.state.brokers, timeout_s,
                               client_config=secure.admin_config(self.state.security))

    def replace_broker(self, node_id: int, pid: int) -> None:
        """Record a broker's new pid (also in stack.json, so `dev down` stops it)."""
        brokers = list(self.state.brokers)
        brokers[node_id - 1] = msgspec.structs.replace(brokers[node_id - 1], pid=pid)
        self._state = msgspec.structs.replace(self.state, brokers=brokers)
        stack.write_state(self.plan.state_dir, self._state)
