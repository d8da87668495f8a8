"""A single-node KRaft Apache Kafka broker from Maven Central's jars.

The jars are fetched once (by Maven, from `deploy/kafka/pom.xml`) into a
cache shared by every state directory; each state directory holds its own
config, data and logs.
"""

from __future__ import annotations

import base64
import os
import shutil
import string
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from tokenmill.devstack import processes
from tokenmill.log import get_logger

log = get_logger("tokenmill.devstack")

KAFKA_VERSION = "4.1.1"


class BrokerSetupError(RuntimeError):
    """Java, Maven or the broker's files are missing or broken."""


def deploy_dir() -> Path:
    """`deploy/kafka` of the source checkout this package runs from."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "deploy" / "kafka"
        if (candidate / "pom.xml").is_file():
            return candidate
    raise BrokerSetupError(
        "deploy/kafka/pom.xml not found next to the tokenmill package; "
        "run the dev stack from a source checkout (pip install -e .)"
    )


def cache_dir() -> Path:
    root = os.environ.get("TOKENMILL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tokenmill"
    )
    return Path(root) / f"kafka-{KAFKA_VERSION}"


def fetch_jars() -> Path:
    """Resolve the broker's runtime jars once; later calls reuse them."""
    lib = cache_dir() / "lib"
    marker = lib / ".complete"
    if marker.is_file():
        return lib
    if shutil.which("java") is None:
        raise BrokerSetupError("java not found on PATH: the Kafka broker needs Java 17+")
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerSetupError("mvn not found on PATH: Maven fetches the Kafka jars once")
    lib.mkdir(parents=True, exist_ok=True)
    log.info("fetching Kafka jars from Maven Central (once)", version=KAFKA_VERSION, into=str(lib))
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(deploy_dir() / "pom.xml"),
         "dependency:copy-dependencies", "-DincludeScope=runtime",
         f"-DoutputDirectory={lib}"],
        capture_output=True, text=True,
    )
    if result.returncode != 0 or not any(lib.glob("kafka_2.13-*.jar")):
        raise BrokerSetupError(
            "Maven could not fetch the Kafka jars:\n" + (result.stdout + result.stderr)[-2000:]
        )
    marker.write_text(KAFKA_VERSION)
    return lib


@dataclass(frozen=True)
class BrokerPlan:
    home: Path  # <state>/kafka
    host: str
    kafka_port: int
    controller_port: int
    heap: str = "1g"

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
    def bootstrap(self) -> str:
        return f"{self.host}:{self.kafka_port}"


def render_config(plan: BrokerPlan) -> str:
    template = string.Template((deploy_dir() / "server.properties").read_text())
    return template.substitute(
        host=plan.host,
        kafka_port=plan.kafka_port,
        controller_port=plan.controller_port,
        data_dir=plan.data_dir,
    )


def _java_command(plan: BrokerPlan, lib: Path, main: str, *args: str) -> list[str]:
    return [
        "java", f"-Xmx{plan.heap}", "-Xms128m", "-XX:+UseG1GC",
        "-XX:TieredStopAtLevel=1" if main != "kafka.Kafka" else "-XX:+UseStringDeduplication",
        f"-Dkafka.logs.dir={plan.logs_dir}",
        f"-Dlog4j2.configurationFile={deploy_dir() / 'log4j2.properties'}",
        "-cp", f"{lib}/*", main, *args,
    ]


def prepare(plan: BrokerPlan, lib: Path) -> None:
    """Write the config and format storage (first start of this state dir only)."""
    plan.home.mkdir(parents=True, exist_ok=True)
    plan.logs_dir.mkdir(parents=True, exist_ok=True)
    plan.config_path.write_text(render_config(plan))
    if (plan.data_dir / "meta.properties").is_file():
        return
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    result = subprocess.run(
        _java_command(plan, lib, "kafka.tools.StorageTool",
                      # "=" form: a base64 id may start with "-", which argparse
                      # would take for an option.
                      "format", f"--cluster-id={cluster_id}", "-c", str(plan.config_path)),
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise BrokerSetupError(
            f"formatting Kafka storage in {plan.data_dir} failed:\n{result.stdout}{result.stderr}"
        )


def start(plan: BrokerPlan, lib: Path) -> int:
    return processes.spawn(
        _java_command(plan, lib, "kafka.Kafka", str(plan.config_path)),
        plan.logs_dir / "broker.out",
    )
