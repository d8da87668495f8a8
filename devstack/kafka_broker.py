"""Apache Kafka brokers (KRaft, combined broker+controller nodes) from Maven
Central's jars, for the local stack.

The jars are fetched once (by Maven, from the `kafka/pom.xml` the package
ships) into a cache shared by every state directory; each node of each state
directory has its own config, data and logs. A node's command line is kept
with the stack's state, so a restart is the same command on the same data.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devstack import prerequisites, processes
from tokenmill import deploy_files
from tokenmill.kafka import kraft
from tokenmill.log import get_logger

log = get_logger("devstack")

KAFKA_VERSION = prerequisites.KAFKA_VERSION
FETCH_TIMEOUT_S = 1800.0


class BrokerSetupError(RuntimeError):
    """Java, Maven or the broker's files are missing or broken."""


def cache_dir() -> Path:
    return Path(prerequisites.kafka_cache_dir())


_DOWNLOADED = re.compile(r"^Downloaded from [^:]+: (\S+) \(([\d.]+) (B|kB|KB|MB|GB)")
_UNIT = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def downloaded(line: str) -> tuple[str, int] | None:
    """(file name, bytes) when a Maven output line reports a finished download."""
    match = _DOWNLOADED.match(line.strip())
    if match is None:
        return None
    url, size, unit = match.groups()
    return url.rsplit("/", 1)[-1], int(float(size) * _UNIT[unit])


def failure_line(output: str) -> str:
    """The line that says why Maven failed: its first [ERROR], else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    errors = [line for line in errors if line]
    if errors:
        return errors[0]
    return lines[-1] if lines else "no output"


def fetch_jars(on_progress: Callable[[str], None] | None = None) -> Path:
    """Resolve the broker's runtime jars once; later calls reuse them.

    `on_progress` receives a short line per downloaded file. Several processes
    may call this at once: one fetches, the others wait for it. A missing
    Java is reported also when the jars are cached: the broker needs it."""
    lib = cache_dir() / "lib"
    marker = lib / ".complete"
    if marker.is_file() and shutil.which("java") is not None:
        return lib
    problems = prerequisites.broker_problems(need_maven=not marker.is_file())
    if problems:
        raise BrokerSetupError(prerequisites.one_line(problems))
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching
        if not marker.is_file():
            _run_maven(lib, on_progress or (lambda _: None))
            marker.write_text(KAFKA_VERSION)
    return lib


def _run_maven(lib: Path, on_progress: Callable[[str], None]) -> None:
    work = cache_dir()
    pom = work / "pom.xml"
    pom.write_text(deploy_files.read_text("deploy/kafka/pom.xml"))
    lib.mkdir(parents=True, exist_ok=True)
    mvn_log = work / "mvn.log"
    log.info("fetching Kafka jars from Maven Central (once)", version=KAFKA_VERSION, into=str(lib))
    on_progress(f"fetching Kafka {KAFKA_VERSION}'s jars from Maven Central (once)")
    command = [shutil.which("mvn") or "mvn", "-B", "-f", str(pom),
               "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={lib}"]
    files, total = 0, 0
    with open(mvn_log, "w") as out:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, cwd=work)
        watchdog = threading.Timer(FETCH_TIMEOUT_S, process.kill)
        watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                out.write(line)
                got = downloaded(line)
                if got is not None:
                    files += 1
                    total += got[1]
                    on_progress(f"fetching Kafka's jars from Maven Central (once): {files} files, "
                                f"{total / 1e6:.1f} MB ({got[0]})")
            code = process.wait()
        finally:
            watchdog.cancel()
    if code != 0 or not any(lib.glob("kafka_2.13-*.jar")):
        reason = failure_line(mvn_log.read_text(errors="replace"))
        raise BrokerSetupError(
            f"Maven could not fetch Kafka's jars from Maven Central: {reason} (log: {mvn_log})")


@dataclass(frozen=True)
class NodePlan:
    """One node of the local cluster: its ports and its directory."""

    node: kraft.Node
    home: Path
    heap: str = "1g"
    quick_jvm: bool = False
    quick_restart: bool = True  # DEV_LIVENESS: a killed node re-registers sooner

    @property
    def config_path(self) -> Path:
        return self.home / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def log_path(self) -> Path:
        return self.logs_dir / "broker.out"

    @property
    def address(self) -> str:
        return f"{self.node.host}:{self.node.kafka_port}"


# The JIT's first tier only and the serial collector, for brokers of a test
# session and for those that live a few minutes (a test's private stack, the
# demo): about half the CPU (a third less to start; tests/liveness/
# test_broker_faults.py's broker, restarted three times: 20 CPU seconds
# instead of 42; the session's shared broker under tests/dataset and
# tests/producer, 47 s: 12.2 CPU seconds instead of 20.0), CPU that a test
# suite's other processes get on a 2-core machine. The shared broker once
# ran the server JVM after two "No leaders found" in one CI run on the quick
# one; those were its own controller fencing it (DEV_LIVENESS's 3 s
# session, which it no longer has). `dev up` and the benchmarks keep the
# server JVM: a broker serving a long run spends less on compiled code.
QUICK_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
SERVER_JVM = ("-XX:+UseG1GC", "-XX:+UseStringDeduplication")


def jdk_key(java: str) -> str:
    """Names the JDK a class archive belongs to (its binary's real path and
    mtime): an archive is only valid for the JVM that wrote it."""
    real = os.path.realpath(java)
    return hashlib.sha1(f"{real}:{os.stat(real).st_mtime_ns}".encode()).hexdigest()[:12]


def class_archive_path(lib: Path, java: str) -> Path:
    """Where the class archive of `lib`'s broker for the JVM `java` lives
    (devstack/class_archive.py makes it)."""
    return lib.parent / f"classes-{jdk_key(java)}.jsa"


def class_archive_flags(lib: Path) -> list[str]:
    """The JVM flag that maps the class archive, when one was made for this
    JDK (a start about a CPU second cheaper); none otherwise."""
    java = shutil.which("java")
    if java is None:
        return []
    archive = class_archive_path(lib, java)
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def java_command(plan: NodePlan, lib: Path, main: str, *args: str) -> list[str]:
    tool = main != "kafka.Kafka"
    return [
        "java",
        f"-Xmx{plan.heap}" if not tool else "-Xmx256m", "-Xms128m" if not tool else "-Xms32m",
        *(QUICK_JVM if tool or plan.quick_jvm else SERVER_JVM),
        *class_archive_flags(lib),
        f"-Dkafka.logs.dir={plan.logs_dir}",
        f"-Dlog4j2.configurationFile={plan.home / 'log4j2.properties'}",
        "-cp", f"{lib}/*", main, *args,
    ]


def broker_command(plan: NodePlan, lib: Path) -> list[str]:
    return java_command(plan, lib, "kafka.Kafka", str(plan.config_path))


def cluster_id(state_dir: Path) -> str:
    """The cluster id of a state directory's cluster, made on first use."""
    path = state_dir / "kafka-cluster-id"
    if not path.is_file():
        state_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(kraft.new_cluster_id())
    return path.read_text().strip()


# A dev node killed and restarted (the broker-fault tests do it on
# purpose) cannot register again until the controller has expired its old
# session: Kafka's 9 s default (broker.session.timeout.ms) was most of a
# single node's restart here. Dev stacks expire it after 3 s; the shipped
# deploy/kafka/server.properties keeps Kafka's defaults for production.
# Not for a broker nobody restarts that serves a loaded machine for long
# (the test session's shared brokers): its own controller fenced it after 3 s
# without a heartbeat ("processExpiredBrokerHeartbeat: controller event queue
# overloaded. Timed out heartbeat from broker 1", a CI run beside a busy
# core), and every partition lost its leader for a moment; the clients of
# the tests running then stalled (a revoke held five minutes, a partition
# never fetched, "No leaders found").
DEV_LIVENESS = """
# dev stack only (devstack/kafka_broker.py): a killed node re-registers sooner
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=750
"""


# Every dev stack: the active controller appends a no-op record to the
# metadata log every 500 ms by default (KIP-835: lag metrics nobody reads
# here), which every node writes, flushes and applies; about a sixth of an
# idle dev broker's CPU (one quick-JVM broker idle for 30 s: 3.43 CPU seconds,
# 2.83 without; three: 7.52 and 6.31). The shipped config keeps the default.
DEV_QUIET = """
# dev stack only (devstack/kafka_broker.py): no idle no-op metadata records
metadata.max.idle.interval.ms=0
"""


def prepare(plans: Sequence[NodePlan], lib: Path, cluster: str, *,
            configure: Callable[[NodePlan, str], str] | None = None,
            format_args: Sequence[str] = ()) -> None:
    """Write each node's config and format the storage of nodes never
    started (in parallel: one JVM each). `configure` rewrites a node's
    config (the secured stack's listeners), `format_args` go to the storage
    format (its SCRAM credentials)."""
    nodes = [plan.node for plan in plans]
    formatting = []
    for plan in plans:
        plan.logs_dir.mkdir(parents=True, exist_ok=True)
        properties = kraft.server_properties(
            nodes, plan.node, data_dir=str(plan.data_dir), cluster_id=cluster) + DEV_QUIET + (
            DEV_LIVENESS if plan.quick_restart else "")
        plan.config_path.write_text(configure(plan, properties) if configure else properties)
        if configure is not None:
            plan.config_path.chmod(0o600)  # it holds the broker's password
        (plan.home / "log4j2.properties").write_text(
            deploy_files.read_text("deploy/kafka/log4j2.properties"))
        if (plan.data_dir / "meta.properties").is_file():
            continue
        # "=" form: a base64 id may start with "-", which argparse would take for an option.
        command = java_command(plan, lib, "kafka.tools.StorageTool", "format",
                               f"--cluster-id={cluster}", "-c", str(plan.config_path),
                               *format_args)
        formatting.append((plan, subprocess.Popen(command, stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True)))
    for plan, process in formatting:
        output, _ = process.communicate(timeout=300)
        if process.returncode != 0:
            raise BrokerSetupError(
                f"formatting Kafka storage in {plan.data_dir} failed: {failure_line(output)}")


def start(argv: Sequence[str], log_path: Path) -> int:
    return processes.spawn(argv, log_path)
