"""Session-wide services for the tests: one real Kafka broker and one S3
endpoint per session; every test gets its own run id (and so its own topics).

Where they come from:
1. `TOKENMILL_TEST_BOOTSTRAP_SERVERS` / `TOKENMILL_TEST_S3_ENDPOINT_URL`, when set;
2. else `TOKENMILL_TEST_SERVICES=containers`: the Kafka and S3 images
   `tokenmill dev images` builds, run by testcontainers through podman's
   Docker-compatible API (tokenmill sets podman up when it is missing);
3. else (`native`, the default): the dev stack (`tokenmill dev up`
   machinery) in a temporary state directory on free ports, ONE for the
   whole session however many xdist workers it has: the first worker that
   needs it starts it (under a file lock in a directory the controller
   made), the others find it there, and the controller stops it at the end.
   Its broker runs the quick JVM, like the tests' private brokers
   (devstack/kafka_broker.py QUICK_JVM says what it saves). On a run of the
   whole suite the controller starts it (and the real
   object store below) itself, in the background while the test processes
   start and collect, so that the first tests find them up.
Whatever the session started is stopped at its end.

The S3-facing tests (`REAL_S3_TESTS`: tests/sink/ and the end-to-end
exactly-once test) run against a real object store instead of moto: their
`settings` point at `real_s3`, Ceph's S3 gateway on a one-node cluster
(devstack/ceph_rgw.py), or `TOKENMILL_TEST_REAL_S3_ENDPOINT_URL` (with
`TOKENMILL_TEST_REAL_S3_ACCESS_KEY_ID` / `_SECRET_ACCESS_KEY`) when set. Like
the stack it is ONE for the session, started by the first process that needs
it (so a session that selects none of those tests never pays for it) and
stopped by the controller. Everything else keeps moto, which starts in 2 s
and keeps the other tests off the real store's disk.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from devstack.private import PrivateStack
from devstack.stack import StackState
from tests import cpu_time
from tests.cpu_time import (  # noqa: F401 - hooks: each test's CPU seconds
    pytest_addoption,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)
from tokenmill.settings import Settings

# Properties are about values, not speed: an example that takes over
# hypothesis's default 200 ms on a loaded machine is not a failure.
hypothesis_settings.register_profile("tokenmill", deadline=None)
hypothesis_settings.load_profile("tokenmill")


@pytest.fixture(scope="session", autouse=True)
def _quiet_logs() -> None:
    from tokenmill import log

    log.configure("warning", "console")


@dataclass(frozen=True)
class Services:
    bootstrap_servers: str
    s3_endpoint_url: str
    s3_access_key: str
    s3_secret_key: str
    origin: str


SERVICE_MODES = ("native", "containers")


def service_mode() -> str:
    mode = os.environ.get("TOKENMILL_TEST_SERVICES", "native")
    if mode not in SERVICE_MODES:
        raise pytest.UsageError(f"TOKENMILL_TEST_SERVICES={mode!r}: expected one of "
                                f"{', '.join(SERVICE_MODES)}")
    return mode


def _from_containers(tmp: Path) -> Iterator[Services]:
    from tests import container_services

    built = container_services.built_images()
    with container_services.podman_api(tmp), \
            container_services.kafka_and_s3(built) as (bootstrap, endpoint):
        yield Services(bootstrap_servers=bootstrap, s3_endpoint_url=endpoint,
                       s3_access_key="testing", s3_secret_key="testing", origin="containers")


# The session's shared stack directory: made by the controller (the only
# process without xdist), inherited by the workers through the environment.
SHARED_STACK_DIR = "TOKENMILL_TEST_SHARED_STACK_DIR"


def pytest_configure(config: pytest.Config) -> None:
    cpu_time.register(config)
    if not hasattr(config, "workerinput") and SHARED_STACK_DIR not in os.environ:
        os.environ[SHARED_STACK_DIR] = tempfile.mkdtemp(prefix="tokenmill-test-stack-")
        config.stash[_made_stack_dir] = Path(os.environ[SHARED_STACK_DIR])
        if _starts_early(config):
            early = threading.Thread(target=_start_shared_services, daemon=True)
            early.start()
            config.stash[_early_start] = early


def _starts_early(config: pytest.Config) -> bool:
    """The whole suite, natively, in test processes: the stack is up before
    the first test that needs it, instead of started by that test while the
    longest files start their own brokers."""
    whole_suite = [str(a) for a in config.args] in ([], ["tests"], [str(config.rootpath / "tests")])
    return (whole_suite and bool(getattr(config.option, "numprocesses", 0))
            and not config.option.collectonly
            and service_mode() == "native"
            and not os.environ.get("TOKENMILL_TEST_BOOTSTRAP_SERVERS"))


def _start_shared_services() -> None:
    """The session's stack, then the real object store. A failure is said
    in one line; the first test that needs the service tries again under
    the same lock and fails with the whole error if it fails again."""
    try:
        _shared_stack()
        if not os.environ.get("TOKENMILL_TEST_REAL_S3_ENDPOINT_URL"):
            _real_s3_native()
    except Exception as exc:  # noqa: BLE001 - the fixtures retry and report it
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        sys.stderr.write(f"starting the session's services early failed ({first_line}); "
                         "the first test that needs them starts them again\n")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A failed session keeps its shared services' logs (the brokers' and
    the others' `logs` directories): the stack directory goes at the end,
    and a test that failed against a sick broker is read from its log."""
    made = session.config.stash.get(_made_stack_dir, None)
    if made is None or exitstatus in (0, 5) or not made.is_dir():
        return
    kept = Path(tempfile.mkdtemp(prefix="tokenmill-test-stack-logs-"))
    for logs in sorted(made.glob("**/logs")):
        if logs.is_dir():
            shutil.copytree(logs, kept / logs.relative_to(made), dirs_exist_ok=True)
    sys.stderr.write(f"the session's shared services' logs are kept in {kept}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_made_stack_dir, None)
    if made is None:
        return
    early = config.stash.get(_early_start, None)
    if early is not None:
        early.join(300)  # stopping what it may still be starting
    from devstack import stack

    for name in ("stack", "secure-stack"):  # secure-stack: tests/secure/conftest.py
        if stack.read_state(made / name) is not None:
            stack.down(made / name)
    if (made / "ceph.json").is_file():
        import msgspec

        from devstack import ceph_rgw

        ceph_rgw.stop(msgspec.json.decode((made / "ceph.json").read_bytes(),
                                          type=ceph_rgw.Cluster))
    shutil.rmtree(made, ignore_errors=True)
    os.environ.pop(SHARED_STACK_DIR, None)


_made_stack_dir = pytest.StashKey[Path]()
_early_start = pytest.StashKey[threading.Thread]()

# Test files and folders whose `settings` point at the real object store.
REAL_S3_TESTS = ("tests/sink/", "tests/e2e/test_pipeline.py")


# The longest files, longest first (from `make test`'s --durations list):
# they start first, so that three test processes finish together instead of
# one running a four-minute file after the others are done (xdist's default
# order, most tests first, put these one-test files last). Then the other
# files with a `slow` test, then the rest, each in collection order.
LONGEST_FIRST = (
    "tests/consumer/test_stranding.py",
    "tests/liveness/test_broker_faults.py",
    "tests/e2e/test_compose.py",  # builds the images when missing (about 2 min) first
    "tests/dataset/test_lineage_e2e.py",
    "tests/liveness/test_broker_bounces.py",
    "tests/consumer/test_resilience.py",
    "tests/foundation/test_devstack.py",
    "tests/sink/test_stranding.py",
    "tests/consumer/test_liveness.py",
    "tests/consumer/test_waste.py",
    "tests/install/test_wheel.py",
    "tests/liveness/test_status_truth.py",
    "tests/consumer/test_breaker_pipeline.py",
    "tests/foundation/test_bad_settings.py",
    "tests/e2e/test_regenerate_turns.py",
    "tests/sink/test_rebalance.py",
)


def run_order(where: str, slow: bool) -> tuple[int, int]:
    """Where a test file goes in the session's queue (smaller: earlier)."""
    if where in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(where))
    return (1, 0) if slow else (2, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = set()
    place: dict[str, str] = {}
    for item in items:
        try:
            where = item.path.relative_to(config.rootpath).as_posix()
        except ValueError:
            where = str(item.path)
        place[item.nodeid] = where
        if where.startswith(REAL_S3_TESTS):
            item.add_marker(pytest.mark.real_s3)
        if item.get_closest_marker("slow") is not None:
            slow_files.add(where)
    # a stable sort: within a file, and among equals, collection order stays
    items.sort(key=lambda item: run_order(place[item.nodeid], place[item.nodeid] in slow_files))


@dataclass(frozen=True)
class RealS3:
    """The session's real object store: its endpoint and keys; `cluster` is
    the native Ceph cluster behind it (None: an endpoint from the environment)."""

    endpoint_url: str
    access_key: str
    secret_key: str
    cluster: object | None = None  # devstack.ceph_rgw.Cluster

    @property
    def name(self) -> str:
        return "ceph" if self.cluster is not None else self.endpoint_url


def _real_s3_native() -> RealS3:
    import msgspec

    from devstack import ceph_rgw, processes, s3_server

    shared = Path(os.environ[SHARED_STACK_DIR])
    state = shared / "ceph.json"
    with open(shared / "ceph.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster = None
        if state.is_file():
            cluster = msgspec.json.decode(state.read_bytes(), type=ceph_rgw.Cluster)
            if not all(processes.running_as(d.pid, d.argv) for d in cluster.daemons):
                ceph_rgw.stop(cluster)
                cluster = None
        if cluster is None:
            home = shared / "ceph"
            shutil.rmtree(home, ignore_errors=True)
            cluster = ceph_rgw.start(home, "127.0.0.1", processes.free_port())
            state.write_bytes(msgspec.json.encode(cluster))
    return RealS3(cluster.endpoint, s3_server.DEV_ACCESS_KEY, s3_server.DEV_SECRET_KEY,
                  cluster)


@pytest.fixture(scope="session")
def real_s3() -> RealS3:
    """The real object store of the S3-facing tests (see the module's docstring)."""
    endpoint = os.environ.get("TOKENMILL_TEST_REAL_S3_ENDPOINT_URL")
    if endpoint:
        return RealS3(endpoint, os.environ.get("TOKENMILL_TEST_REAL_S3_ACCESS_KEY_ID", ""),
                      os.environ.get("TOKENMILL_TEST_REAL_S3_SECRET_ACCESS_KEY", ""))
    return _real_s3_native()


def _shared_stack() -> StackState:
    """The session's one stack: started by the first process to ask, under a
    lock; stopped by the controller (pytest_unconfigure)."""
    from devstack import stack

    shared = Path(os.environ[SHARED_STACK_DIR])
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = stack.read_state(shared / "stack")
        if state is None or not all(stack.running(state).values()):
            # never killed, and busy under the whole suite: Kafka's own
            # broker session (devstack/kafka_broker.py DEV_LIVENESS); the
            # quick JVM (QUICK_JVM says what it saves)
            state, _ = stack.up(stack.StackPlan.on_free_ports(shared / "stack",
                                                              kafka_heap="768m",
                                                              quick_restart=False,
                                                              quick_jvm=True))
    return state


def _from_native() -> Services:
    from devstack import s3_server

    state = _shared_stack()
    return Services(
        bootstrap_servers=state.bootstrap,
        s3_endpoint_url=state.s3.address,
        s3_access_key=s3_server.DEV_ACCESS_KEY,
        s3_secret_key=s3_server.DEV_SECRET_KEY,
        origin="native",
    )


@pytest.fixture(scope="session")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    bootstrap = os.environ.get("TOKENMILL_TEST_BOOTSTRAP_SERVERS")
    endpoint = os.environ.get("TOKENMILL_TEST_S3_ENDPOINT_URL")
    if bootstrap and endpoint:
        yield Services(
            bootstrap, endpoint,
            os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
            os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
            origin="environment",
        )
    elif service_mode() == "containers":
        yield from _from_containers(tmp_path_factory.mktemp("podman"))
    else:
        yield _from_native()


@pytest.fixture
def settings(request: pytest.FixtureRequest, services: Services, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Kafka from `services`; S3 from `real_s3` for the tests marked `real_s3`
    (REAL_S3_TESTS), else from `services`."""
    endpoint, key, secret = (services.s3_endpoint_url, services.s3_access_key,
                             services.s3_secret_key)
    if request.node.get_closest_marker("real_s3") is not None:
        real: RealS3 = request.getfixturevalue("real_s3")
        endpoint, key, secret = real.endpoint_url, real.access_key, real.secret_key
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return Settings(
        bootstrap_servers=services.bootstrap_servers,
        s3_endpoint_url=endpoint,
        s3_bucket=f"tm-{uuid.uuid4().hex[:12]}",
        state_dir=tmp_path / "state",
        connect_timeout_s=10.0,
    )


@pytest.fixture
def run_id() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def private_stack(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., PrivateStack]]:
    """A factory of stacks of the test's own, beside the session's `services`:
    `private_stack(brokers=3)` starts 3 KRaft brokers and an S3 server on free
    ports; each node can be killed, stopped and started (`stack.broker(2).kill()`).
    Everything started is stopped when the test ends."""
    started: list[PrivateStack] = []

    def start(brokers: int = 1, **options: object) -> PrivateStack:
        stack = PrivateStack(tmp_path_factory.mktemp(f"private-{brokers}b"), brokers=brokers,
                             **options)  # type: ignore[arg-type]
        started.append(stack)
        return stack.up()

    yield start
    for stack in started:
        stack.down()
