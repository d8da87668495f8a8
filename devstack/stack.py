"""Bring the dev stack up and down, repair it, and say what runs where.

State lives in `<state_dir>/stack.json`, with each service's command line;
every process runs in its own session so `down` can stop the whole group and
leave nothing behind. `up` on a stack that is partly down restarts only what
is down, the same command on the same data, and never replaces a running S3
server (moto keeps its objects in memory: a new one would be empty).

The S3 server is one of two kinds (`StackPlan.s3_kind`): `moto` (the
default: in memory, starts in 2 s) or `ceph`, a real object store (Ceph's
S3 gateway on a one-node cluster, devstack/ceph_rgw.py), whose objects last
across restarts of any of its processes.
"""

from __future__ import annotations

import importlib.util
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import msgspec

from devstack import ceph_rgw, class_archive, kafka_broker, processes, s3_server, secure
from tokenmill.kafka import kraft
from tokenmill.log import get_logger

log = get_logger("devstack")

DEFAULT_BUCKET = "tokenmill"
S3_KINDS = ("moto", ceph_rgw.KIND)
LOCAL_EXTRA_HINT = ("the local stack needs moto, which comes with the `local` extra: "
                    "pip install 'tokenmill[local]' (from a checkout: pip install -e '.[local]')")


class ServiceState(msgspec.Struct):
    name: str  # kafka-<node id> or s3
    pid: int
    address: str
    log: str
    argv: list[str]  # the command line, to restart it the same way
    ports: list[int]


class StackState(msgspec.Struct):
    brokers: list[ServiceState]
    s3: ServiceState
    bucket: str
    started_at: float
    security: secure.SecureState | None = None  # `dev up --secure`
    s3_kind: str = "moto"
    # The processes behind a real S3 server's gateway (Ceph: monitor, OSD).
    s3_cluster: list[ServiceState] = msgspec.field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        """Every broker, as clients take it (`host:port,host:port`)."""
        return ",".join(broker.address for broker in self.brokers)

    def services(self) -> list[ServiceState]:
        return [*self.brokers, *self.s3_cluster, self.s3]

    def env(self) -> dict[str, str]:
        return {
            "TOKENMILL_BOOTSTRAP_SERVERS": self.bootstrap,
            "TOKENMILL_S3_ENDPOINT_URL": self.s3.address,
            "TOKENMILL_S3_BUCKET": self.bucket,
            "AWS_ACCESS_KEY_ID": s3_server.DEV_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": s3_server.DEV_SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            **(secure.shared_env(self.security) if self.security else {}),
        }


class StackError(RuntimeError):
    """The dev stack could not be started."""


# What setting the stack up can fail with: a command prints it as one line.
SETUP_ERRORS: tuple[type[BaseException], ...] = (
    StackError, kafka_broker.BrokerSetupError, processes.PortInUse, ceph_rgw.CephSetupError)


@dataclass(frozen=True)
class StackPlan:
    """Where the stack runs. Node i of the cluster listens on `kafka_ports[i]`
    (clients) and `controller_ports[i]` (the KRaft quorum)."""

    state_dir: Path
    host: str = "127.0.0.1"
    kafka_ports: tuple[int, ...] = (9092,)
    controller_ports: tuple[int, ...] = (9093,)
    s3_port: int = 9000
    s3_kind: str = "moto"
    bucket: str = DEFAULT_BUCKET
    kafka_heap: str = "1g"
    timeout_s: float = 120.0
    secure: bool = False  # SASL_SSL, ACLs, a principal per role (devstack/secure.py)
    # Brokers that live minutes (a test's private stack, the demo): a JVM that
    # starts on less CPU (devstack/kafka_broker.py QUICK_JVM says when not).
    quick_jvm: bool = False
    # A killed node re-registers after 3 s (kafka_broker.DEV_LIVENESS says
    # when not): off for brokers nobody kills that serve a loaded machine.
    quick_restart: bool = True
    nodes: tuple[kraft.Node, ...] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.kafka_ports) != len(self.controller_ports) or not self.kafka_ports:
            raise ValueError("one Kafka port and one controller port per broker")
        if self.s3_kind not in S3_KINDS:
            raise ValueError(f"S3 server kind {self.s3_kind!r}: expected one of "
                             f"{', '.join(S3_KINDS)}")
        nodes = tuple(kraft.Node(i + 1, self.host, k, c)
                      for i, (k, c) in enumerate(zip(self.kafka_ports, self.controller_ports)))
        object.__setattr__(self, "nodes", nodes)

    @property
    def brokers(self) -> int:
        return len(self.nodes)

    @classmethod
    def on_ports(cls, state_dir: Path, *, kafka_port: int = 9092, controller_port: int = 9093,
                 brokers: int = 1, **options: Any) -> StackPlan:
        """Node i on `kafka_port + 2i` and `controller_port + 2i` (9092/9093,
        9094/9095, ... with the defaults)."""
        return cls(state_dir=state_dir,
                   kafka_ports=tuple(kafka_port + 2 * i for i in range(brokers)),
                   controller_ports=tuple(controller_port + 2 * i for i in range(brokers)),
                   **options)

    @classmethod
    def on_free_ports(cls, state_dir: Path, *, brokers: int = 1, **options: Any) -> StackPlan:
        """A private stack (tests, benchmarks, the demo) beside whatever else
        runs: every port picked free."""
        return cls(state_dir=state_dir,
                   kafka_ports=tuple(processes.free_port() for _ in range(brokers)),
                   controller_ports=tuple(processes.free_port() for _ in range(brokers)),
                   s3_port=processes.free_port(), **options)

    def node_plans(self) -> list[kafka_broker.NodePlan]:
        single = self.brokers == 1
        return [kafka_broker.NodePlan(
                    node=node, heap=self.kafka_heap, quick_jvm=self.quick_jvm,
                    quick_restart=self.quick_restart,
                    home=self.state_dir / ("kafka" if single else f"kafka-{node.node_id}"))
                for node in self.nodes]


def state_path(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def read_state(state_dir: Path) -> StackState | None:
    path = state_path(state_dir)
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=StackState)
    except msgspec.DecodeError as exc:
        raise StackError(
            f"cannot read {path} ({exc}); stop what it started and remove it") from None


def write_state(state_dir: Path, state: StackState) -> None:
    path = state_path(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    tmp.replace(path)


def is_running(service: ServiceState) -> bool:
    return processes.running_as(service.pid, service.argv)


def running(state: StackState) -> dict[str, bool]:
    return {service.name: is_running(service) for service in state.services()}


Progress = Callable[[str], None]


def up(plan: StackPlan, on_progress: Progress | None = None) -> tuple[StackState, list[str]]:
    """Start the stack, or what of it is down; returns (state, names started).
    An empty list means everything was already running."""
    if plan.s3_kind == "moto" and importlib.util.find_spec("moto") is None:
        raise StackError(LOCAL_EXTRA_HINT)
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    existing = read_state(plan.state_dir)
    if existing is not None:
        return _repair(plan, existing)
    for node in plan.nodes:
        suffix = "" if plan.brokers == 1 else f" {node.node_id}"
        processes.require_free(plan.host, node.kafka_port, f"Kafka{suffix}", "--kafka-port")
        processes.require_free(plan.host, node.controller_port, f"the Kafka controller{suffix}",
                               "--controller-port")
    processes.require_free(plan.host, plan.s3_port, "the S3 server", "--s3-port")

    lib = kafka_broker.fetch_jars(on_progress)
    class_archive.ensure(lib, on_progress)  # once: every broker start after it is cheaper
    node_plans = plan.node_plans()
    security = (secure.prepare(plan.state_dir, [node.host for node in plan.nodes],
                               [node_plan.data_dir for node_plan in node_plans])
                if plan.secure else None)
    kafka_broker.prepare(node_plans, lib, kafka_broker.cluster_id(plan.state_dir),
                         **secure.broker_setup(security))
    brokers = []
    for node_plan in node_plans:
        argv = kafka_broker.broker_command(node_plan, lib)
        brokers.append(ServiceState(
            name=f"kafka-{node_plan.node.node_id}",
            pid=kafka_broker.start(argv, node_plan.log_path),
            address=node_plan.address, log=str(node_plan.log_path), argv=argv,
            ports=[node_plan.node.kafka_port, node_plan.node.controller_port]))
    try:
        s3, cluster = _start_s3(plan, on_progress)
    except BaseException:
        processes.stop_all([broker.pid for broker in brokers])
        raise
    state = StackState(brokers=brokers, s3=s3, bucket=plan.bucket, started_at=time.time(),
                       s3_kind=plan.s3_kind, s3_cluster=cluster, security=security)
    write_state(plan.state_dir, state)
    try:
        _wait_until_ready(state, plan.timeout_s, on_progress)
    except BaseException:
        down(plan.state_dir)
        raise
    return state, [service.name for service in state.services()]


def _start_s3(plan: StackPlan,
              on_progress: Progress | None) -> tuple[ServiceState, list[ServiceState]]:
    """The S3 server: (its endpoint's process, the processes behind it)."""
    host, port = plan.host, plan.s3_port
    if plan.s3_kind == ceph_rgw.KIND:
        cluster = ceph_rgw.start(plan.state_dir / "ceph", host, port, on_progress,
                                 timeout_s=plan.timeout_s)
        services = [ServiceState(**msgspec.structs.asdict(d)) for d in cluster.daemons]
        return services[-1], services[:-1]
    argv = s3_server.command(host, port)
    log_path = plan.state_dir / "logs" / "s3.out"
    return ServiceState(name="s3", pid=processes.spawn(argv, log_path),
                        address=f"http://{host}:{port}", log=str(log_path), argv=argv,
                        ports=[port]), []


def _refuse_changes(plan: StackPlan, state: StackState) -> None:
    """A stack set up one way is not repaired into another: say how to change it."""
    down = f"stop it (`tokenmill dev down --state-dir {plan.state_dir}`)"
    if len(state.brokers) != plan.brokers:
        raise StackError(f"a {len(state.brokers)}-broker stack is set up in {plan.state_dir}; "
                         f"{down} to change --brokers")
    if (state.security is not None) != plan.secure:
        raise StackError(
            f"a {'secured' if state.security else 'plain'} stack is set up in {plan.state_dir}; "
            f"{down} to change --secure")
    if state.s3_kind != plan.s3_kind:
        raise StackError(f"a stack with the {state.s3_kind} S3 server is set up in "
                         f"{plan.state_dir}; {down} to change --s3")


def _restart_if_down(services: list[ServiceState], state_dir: Path, restarted: list[str],
                     start: Callable[[ServiceState], int]) -> list[ServiceState]:
    """The same command on the same data for each service that is down."""
    out = []
    for service in services:
        if not is_running(service):
            _require_ports(service, state_dir)
            service = msgspec.structs.replace(service, pid=start(service))
            restarted.append(service.name)
        out.append(service)
    return out


def _repair(plan: StackPlan, state: StackState) -> tuple[StackState, list[str]]:
    """Restart what is down, the same command on the same data."""
    _refuse_changes(plan, state)
    restarted: list[str] = []
    brokers = _restart_if_down(state.brokers, plan.state_dir, restarted,
                               lambda b: kafka_broker.start(b.argv, Path(b.log)))
    # The real store keeps its data: same command, same data.
    cluster = _restart_if_down(state.s3_cluster, plan.state_dir, restarted,
                               lambda s: processes.spawn(s.argv, Path(s.log)))
    s3 = state.s3
    if not is_running(s3):
        _require_ports(s3, plan.state_dir)
        s3 = msgspec.structs.replace(s3, pid=processes.spawn(s3.argv, Path(s3.log)))
        restarted.append(s3.name)
        if state.s3_kind == "moto":  # its objects went with it (moto keeps them in memory)
            log.warning("the S3 server had stopped; started a new, empty one",
                        address=s3.address)
    state = msgspec.structs.replace(state, brokers=brokers, s3=s3, s3_cluster=cluster)
    if restarted:
        write_state(plan.state_dir, state)
    try:
        _wait_for_s3(s3, plan.timeout_s)
    except StackError as exc:
        if s3.name in restarted:
            raise
        raise StackError(f"{exc}; it was left running (a new one would have none of its "
                         f"objects): `tokenmill dev down` stops the stack") from None
    wait_for_brokers(brokers, plan.timeout_s, client_config=secure.admin_config(state.security))
    _ensure_bucket(state)
    return state, restarted


def _require_ports(service: ServiceState, state_dir: Path) -> None:
    host = service.address.removeprefix("http://").rpartition(":")[0]
    for port in service.ports:
        if not processes.port_free(host, port):
            raise processes.PortInUse(
                f"{service.name} is down and its port {port} on {host} is taken by another "
                f"process; free it, or `tokenmill dev down --state-dir {state_dir}` and start "
                f"the stack again on other ports")


def _wait_until_ready(state: StackState, timeout_s: float, on_progress: Progress | None) -> None:
    if on_progress:
        on_progress(f"waiting for {len(state.brokers)} Kafka broker(s) and the S3 server")
    _wait_for_s3(state.s3, timeout_s)
    wait_for_brokers(state.brokers, timeout_s, client_config=secure.admin_config(state.security))
    if state.security is not None:
        secure.grant_admin(state.security, state.bootstrap)
    _ensure_bucket(state)


def _tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def registered_brokers(bootstrap: str, timeout_s: float = 2.0,
                       client_config: dict[str, Any] | None = None) -> set[int]:
    """Node ids of the brokers the cluster reports as up (empty: no answer)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _SILENT,
                              "socket.connection.setup.timeout.ms": int(timeout_s * 1000),
                              **(client_config or {})}
    client = AdminClient(config)
    try:
        return set(client.list_topics(timeout=timeout_s).brokers)
    except KafkaException:
        return set()


class _Silent:
    """librdkafka's connection errors while a broker starts are expected."""

    def log(self, *args: Any) -> None:
        pass


_SILENT = _Silent()


def wait_for_brokers(brokers: list[ServiceState], timeout_s: float,
                     bootstrap: str | None = None,
                     client_config: dict[str, Any] | None = None) -> None:
    """Until each of `brokers` runs, listens, and the cluster (reached through
    `bootstrap`, default: these brokers) reports it up."""
    deadline = time.monotonic() + timeout_s
    wanted = {int(broker.name.rpartition("-")[2]) for broker in brokers}
    bootstrap = bootstrap or ",".join(broker.address for broker in brokers)
    while time.monotonic() < deadline:
        for broker in brokers:
            if not processes.alive(broker.pid):
                raise StackError(f"Kafka broker {broker.name} exited during start-up; "
                                 f"last log lines:\n{_tail(broker.log)}")
        listening = all(processes.port_open(*_host_port(b.address)) for b in brokers)
        if listening and wanted <= registered_brokers(bootstrap, client_config=client_config):
            return
        time.sleep(0.5)
    raise StackError(f"Kafka did not answer at {bootstrap} within {timeout_s:.0f}s; "
                     f"logs: {', '.join(b.log for b in brokers)}")


def _wait_for_s3(s3: ServiceState, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not processes.alive(s3.pid):
            raise StackError(f"the S3 server exited during start-up:\n{_tail(s3.log)}")
        try:
            with urllib.request.urlopen(s3.address + "/", timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise StackError(f"the S3 server (pid {s3.pid}) did not answer at {s3.address} within "
                     f"{timeout_s:.0f}s; see {s3.log}")


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
    running_services = [service for service in state.services() if is_running(service)]
    processes.stop_all([service.pid for service in running_services])
    state_path(state_dir).unlink(missing_ok=True)
    stopped = [service.name for service in running_services]
    return stopped
