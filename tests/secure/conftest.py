"""ONE secured broker for the session (`tokenmill dev up --secure`'s
machinery on free ports: SASL_SSL with SCRAM-SHA-512, TLS from a CA made for
it, the StandardAuthorizer on, a principal per role and no role ACL until a
test grants its run's): the first test process that needs it starts it,
under a lock in the session's shared directory (tests/conftest.py), the
others find it there, and the controller stops it at the end."""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from devstack import secure, stack
from tokenmill.settings import Secret, Settings

ROLES = (*secure.ROLES, secure.ADMIN)
# The session's shared directory (tests/conftest.py), which stops what is in it.
SHARED_STACK_DIR = "TOKENMILL_TEST_SHARED_STACK_DIR"


@dataclass(frozen=True)
class SecureServices:
    state: stack.StackState
    started_in_s: float  # 0 when another test process had started it

    @property
    def security(self) -> secure.SecureState:
        assert self.state.security is not None
        return self.state.security

    @property
    def bootstrap(self) -> str:
        return self.state.bootstrap

    @property
    def ca_location(self) -> str:
        return self.security.ca_location

    def password(self, role: str) -> str:
        return secure.password(self.security, role)

    def settings(self, role: str, tmp_path: Path | None = None, **overrides: Any) -> Settings:
        """tokenmill's settings logged in as `role`."""
        values: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap, "security_protocol": "SASL_SSL",
            "sasl_mechanism": secure.MECHANISM, "sasl_username": role,
            "sasl_password": Secret(self.password(role)), "ssl_ca_location": self.ca_location,
            "s3_endpoint_url": self.state.s3.address, "connect_timeout_s": 10.0}
        if tmp_path is not None:
            values["state_dir"] = tmp_path / "state"
        values.update(overrides)
        return Settings(**values)

    def env(self, role: str, **extra: str) -> dict[str, str]:
        """The environment of a `tokenmill` child process logged in as `role`."""
        return {**os.environ, **self.state.env(), **secure.role_env(self.security, role),
                "PYTHONUNBUFFERED": "1", **extra}

    def kafka_python(self, role: str) -> dict[str, Any]:
        """kafka-python's security settings as `role` (a client that shares
        no code with tokenmill): `read_all(..., security=...)`."""
        return {"security_protocol": "SASL_SSL", "sasl_mechanism": secure.MECHANISM,
                "sasl_plain_username": role, "sasl_plain_password": self.password(role),
                "ssl_cafile": self.ca_location}

    def librdkafka(self, role: str) -> dict[str, Any]:
        """confluent-kafka's connection settings as `role`."""
        return {"bootstrap.servers": self.bootstrap,
                **secure.client_config(self.security, role)}

    def new_bucket(self) -> str:
        bucket = f"tm-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.state.s3.address, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing",
                     ).create_bucket(Bucket=bucket)
        return bucket


def _shared_secure_stack() -> SecureServices:
    shared = Path(os.environ[SHARED_STACK_DIR])
    directory = shared / "secure-stack"
    with open(shared / "secure.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = stack.read_state(directory)
        started_in = 0.0
        if state is None or not all(stack.running(state).values()):
            began = time.monotonic()
            state, _ = stack.up(stack.StackPlan.on_free_ports(directory, kafka_heap="768m",
                                                              secure=True, quick_restart=False))
            started_in = time.monotonic() - began
            (shared / "secure-start-seconds").write_text(f"{started_in:.1f}\n")
    return SecureServices(state, started_in)


@pytest.fixture(scope="session")
def secure_services() -> SecureServices:
    """The session's secured broker (and an S3 server beside it)."""
    return _shared_secure_stack()
