"""`tokenmill deploy systemd | compose | monitoring --out DIR`: the deployment
files the package carries (`deploy/`, `docker/`), filled in from flags and
settings.

The values are worked out by small pure functions (one per file set) and
rendered by `tokenmill.deploy_files`; the commands only write the result.
Another folder of shipped files gets a subcommand the same way (as
`monitoring` does for Prometheus and Grafana): a function from flags to
values, then `deploy_files.folder_files`.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import click
from rich.console import Console

from ops.acls import acls_command
from tokenmill import deploy_files
from tokenmill.commandline import service_command
from tokenmill.deploy_files import RenderedFile
from tokenmill.flag_types import HEAP, PORT, RUN_ID, FiniteFloat
from tokenmill.kafka import kraft
from tokenmill.settings import OPTIONS, Settings, SettingsError

console = Console(stderr=True)

# Settings a host does not share with the others, or that the units set.
_NOT_IN_ENV_FILE = {"state_dir", "log_format", "sasl_password"}


def env_file_settings(settings: Settings, run: str) -> str:
    """The `TOKENMILL_*` lines of tokenmill.env: the run, every setting that
    differs from its default (plus the broker and bucket), never a secret."""
    defaults = Settings()
    lines = [f"TOKENMILL_RUN={run}"]
    for option in OPTIONS:
        value = getattr(settings, option.name)
        wanted = option.name in ("bootstrap_servers", "s3_bucket")
        if option.name in _NOT_IN_ENV_FILE or value is None:
            continue
        if wanted or value != getattr(defaults, option.name):
            lines.append(f"{option.env}={value}")
    lines.append("TOKENMILL_LOG_FORMAT=json")
    if settings.sasl_mechanism:
        lines.append("# TOKENMILL_SASL_PASSWORD=   (the secret: write it here by hand)")
    return "\n".join(lines)


@dataclass(frozen=True)
class SystemdPlan:
    run: str
    gpus: int
    install_dir: str
    user: str
    model: str
    sglang_port: int = 30000
    metrics_port: int = 9100
    sink_metrics_port: int = 9200
    kafka_hosts: tuple[str, ...] = ()
    kafka_heap: str = "4g"
    cluster_id: str = ""
    mtp: bool = False


# Speculative decoding through the model's MTP layers, as the seed run used it
# (SGLang's NEXTN: draft 3 steps, one candidate each, verify 4 tokens).
MTP_ARGS = ("--speculative-algorithm NEXTN --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")


def speculative_args(mtp: bool) -> str:
    """SGLANG_SPECULATIVE_ARGS: empty unless the model has MTP layers, since
    SGLang refuses NEXTN for a model without them."""
    return MTP_ARGS if mtp else ""


def gpu_units(gpus: int) -> str:
    return " ".join(f"sglang@{i}.service tokenmill-consume@{i}.service" for i in range(gpus))


def kafka_nodes(hosts: tuple[str, ...]) -> list[kraft.Node]:
    return [kraft.Node(i + 1, host, 9092, 9093) for i, host in enumerate(hosts)]


def systemd_files(plan: SystemdPlan, settings: Settings) -> list[RenderedFile]:
    """Units in `systemd/`, environment files in `etc/` (the sink's named by
    its run, so a replay's sink runs beside its parent's), and with Kafka
    hosts each host's broker config in `kafka/<host>/` plus the shared Kafka
    files."""
    values = {
        "install_dir": plan.install_dir.rstrip("/"), "user": plan.user, "gpus": plan.gpus,
        "gpu_units": gpu_units(plan.gpus), "sink_metrics_port": plan.sink_metrics_port,
        "model": plan.model, "settings": env_file_settings(settings, plan.run),
        "kafka_heap": plan.kafka_heap, "cluster_id": plan.cluster_id,
        "speculative_args": speculative_args(plan.mtp), "run": plan.run,
    }
    units = ["sglang@.service", "tokenmill-consume@.service", "tokenmill-sink@.service",
             "tokenmill-gpus.target"]
    files = [RenderedFile(f"systemd/{unit}",
                          deploy_files.render_file(f"deploy/systemd/{unit}", values))
             for unit in units]
    files.append(RenderedFile("etc/tokenmill.env",
                              deploy_files.render_file("deploy/systemd/tokenmill.env", values),
                              0o600))
    files.append(RenderedFile("etc/sglang.env",
                              deploy_files.render_file("deploy/systemd/sglang.env", values)))
    files.append(RenderedFile(f"etc/sink-{plan.run}.env",
                              deploy_files.render_file("deploy/systemd/sink.env", values)))
    for gpu in range(plan.gpus):
        files.append(RenderedFile(f"etc/gpu-{gpu}.env", deploy_files.render_file(
            "deploy/systemd/gpu.env", {"gpu": gpu, "sglang_port": plan.sglang_port + gpu,
                                "metrics_port": plan.metrics_port + gpu})))
    if plan.kafka_hosts:
        nodes = kafka_nodes(plan.kafka_hosts)
        files.append(RenderedFile("systemd/tokenmill-kafka.service", deploy_files.render_file(
            "deploy/systemd/tokenmill-kafka.service", values)))
        files.append(RenderedFile("kafka/pom.xml", deploy_files.read_text("deploy/kafka/pom.xml")))
        files.append(RenderedFile("kafka/log4j2.properties",
                                  deploy_files.read_text("deploy/kafka/log4j2.properties")))
        for node in nodes:
            files.append(RenderedFile(
                f"kafka/{node.host}/server.properties", kraft.server_properties(
                    nodes, node, data_dir="/var/lib/kafka/data", cluster_id=plan.cluster_id,
                    listen_host="0.0.0.0")))
    return files


def monitoring_files() -> list[RenderedFile]:
    """The Prometheus rules and example config, and the Grafana dashboard, as
    shipped (they take no values: Prometheus and Grafana fill in their own)."""
    return [RenderedFile(f"{folder}/{file.path}", file.text)
            for folder in ("prometheus", "grafana")
            for file in deploy_files.folder_files(f"deploy/{folder}", {})]


# The images `tokenmill dev images` builds (devstack/images.py).
DEFAULT_KAFKA_IMAGE = "localhost/tokenmill-kafka:local"
DEFAULT_S3_IMAGE = "localhost/tokenmill-s3:local"


def kafka_image_environment(properties: str) -> dict[str, str]:
    """server.properties as the apache/kafka image's variables: `a.b_c` is
    `KAFKA_A_B__C` (dots to _, underscores doubled)."""
    env = {}
    for line in properties.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        env["KAFKA_" + key.strip().replace("_", "__").replace(".", "_").upper()] = value.strip()
    return env


def compose_files(*, run: str, gpus: int, time_scale: float, requirement: str, image: str,
                  cluster_id: str, kafka_image: str = DEFAULT_KAFKA_IMAGE,
                  s3_image: str = DEFAULT_S3_IMAGE) -> list[RenderedFile]:
    node = kraft.Node(1, "kafka", 9092, 9093)
    properties = kraft.server_properties([node], node, data_dir="/tmp/kraft-combined-logs",
                                         cluster_id=cluster_id, listen_host="0.0.0.0")
    kafka_env = "\n".join(f"      {key}: {json.dumps(value)}"
                          for key, value in kafka_image_environment(properties).items())
    gpu_services = "\n".join(
        deploy_files.render_file("docker/compose-gpu.yaml",
                                 {"gpu": gpu, "run": run, "time_scale": time_scale}).rstrip("\n")
        for gpu in range(gpus))
    values = {"run": run, "gpus": gpus, "image": image, "requirement": requirement,
              "cluster_id": cluster_id, "kafka_environment": kafka_env,
              "gpu_services": gpu_services, "kafka_image": kafka_image, "s3_image": s3_image}
    return [RenderedFile("compose.yaml", deploy_files.render_file("docker/compose.yaml", values)),
            RenderedFile("Dockerfile", deploy_files.dockerfile(requirement))]


def package_version() -> str:
    try:
        return version("tokenmill")
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.1.0"


def _write(out: Path, files: list[RenderedFile]) -> None:
    written = deploy_files.write_files(out, files)
    console.print(f"wrote {len(written)} files to {out}:")
    for path in written:
        console.print(f"  {path.relative_to(out)}")


@click.group()
def deploy() -> None:
    """Write deployment files (systemd units, Docker Compose, monitoring) for your set-up,
    and the Kafka ACLs of each role."""


deploy.add_command(acls_command)


@deploy.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the files to (created if missing).")
@click.option("--run", "run_id", required=True, type=RUN_ID,
              help="Run the workers and the sink serve.")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, 64),
              help="GPUs per host: one SGLang server and one worker each.")
@click.option("--model", default="Qwen/Qwen3-8B", show_default=True,
              help="Model path SGLang serves (sglang.env).")
@click.option("--kafka-hosts", default="", help="Comma list of Kafka hosts: writes a KRaft "
              "node config per host (replication 3 and min.insync.replicas 2 from 3 hosts).")
@click.option("--install-dir", default=sys.prefix, show_default="this Python's prefix",
              help="Where tokenmill is installed on the hosts (its bin/ has `tokenmill`).")
@click.option("--user", default="tokenmill", show_default=True, help="User the services run as.")
@click.option("--sglang-port", default=30000, show_default=True, type=PORT,
              help="GPU i's SGLang server listens on this + i.")
@click.option("--metrics-port", default=9100, show_default=True, type=PORT,
              help="GPU i's worker serves Prometheus metrics on this + i.")
@click.option("--sink-metrics-port", default=9200, show_default=True, type=PORT,
              help="The run's sink serves Prometheus metrics here (another run's sink on "
              "the same host needs another port).")
@click.option("--kafka-heap", default="4g", show_default=True, type=HEAP)
@click.option("--mtp/--no-mtp", default=False, show_default=True,
              help="Speculative decoding with the model's multi-token-prediction layers "
              "(Qwen3.5/3.6, DeepSeek-V3; sglang.env).")
@service_command
def systemd(settings: Settings, out_dir: Path, run_id: str, gpus: int, model: str,
            kafka_hosts: str, install_dir: str, user: str, sglang_port: int, metrics_port: int,
            sink_metrics_port: int, kafka_heap: str, mtp: bool) -> None:
    """systemd units and environment files for GPU hosts, the sink and Kafka.

    \b
    Example:
      tokenmill deploy systemd --out deploy-out --run qwen-r1 --gpus 8 \\
          --kafka-hosts kafka-1,kafka-2,kafka-3 \\
          --bootstrap-servers kafka-1:9092,kafka-2:9092,kafka-3:9092 --s3-bucket my-data
    """
    if not settings.s3_bucket:
        raise SettingsError("--s3-bucket (or TOKENMILL_S3_BUCKET) is needed: the sink writes there")
    hosts = tuple(h.strip() for h in kafka_hosts.split(",") if h.strip())
    plan = SystemdPlan(run=run_id, gpus=gpus, install_dir=install_dir, user=user, model=model,
                       sglang_port=sglang_port, metrics_port=metrics_port,
                       sink_metrics_port=sink_metrics_port, kafka_hosts=hosts,
                       kafka_heap=kafka_heap, cluster_id=kraft.new_cluster_id(), mtp=mtp)
    _write(out_dir, systemd_files(plan, settings))
    console.print(
        "\nOn each GPU host: copy systemd/* to /etc/systemd/system/ and etc/* to /etc/tokenmill/, "
        "then `systemctl daemon-reload && systemctl enable --now tokenmill-gpus.target`. "
        f"On the sink host: copy the same, then `systemctl daemon-reload && systemctl enable "
        f"--now tokenmill-sink@{run_id}` (one sink per run: a replay's runs beside it)."
        + ("\nOn Kafka host H: copy kafka/H/server.properties, kafka/log4j2.properties and "
           "kafka/pom.xml to /etc/kafka/ and follow the steps at the top of "
           "systemd/tokenmill-kafka.service." if hosts else ""))


@deploy.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write the files to (created if missing).")
def monitoring(out_dir: Path) -> None:
    """Prometheus alerting rules, an example scrape config and a Grafana dashboard.

    \b
    Example:
      tokenmill deploy monitoring --out monitoring
      promtool check rules monitoring/prometheus/alerts.yml
    """
    _write(out_dir, monitoring_files())
    console.print(
        "\nPrometheus: put your hosts in prometheus/prometheus.yml's targets (or add "
        "prometheus/alerts.yml to your rule_files) and reload it. Grafana: import "
        "grafana/tokenmill.json and pick your Prometheus data source.")


@deploy.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write compose.yaml and the Dockerfile to (the build context).")
@click.option("--run", "run_id", default="demo", show_default=True, type=RUN_ID,
              help="Run the workers and the sink serve.")
@click.option("--gpus", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Simulated GPUs: one simulator and one worker each.")
@click.option("--time-scale", default=100.0, show_default=True,
              type=FiniteFloat(min=0.0, min_open=True),
              help="The simulators' speed-up over a real GPU.")
@click.option("--wheel", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=None, help="Install this tokenmill wheel in the image (copied next to the "
              "Dockerfile) instead of the released version from PyPI.")
@click.option("--image", default=None, show_default="tokenmill:<version>",
              help="Name of tokenmill's image (built from the Dockerfile when missing).")
@click.option("--kafka-image", default=DEFAULT_KAFKA_IMAGE, show_default=True,
              help="A Kafka 4.1 KRaft image configured by KAFKA_* variables (apache/kafka's "
              "convention; `tokenmill dev images` builds the default).")
@click.option("--s3-image", default=DEFAULT_S3_IMAGE, show_default=True,
              help="An S3 API server listening on port 9000 (`tokenmill dev images` builds the "
              "default: moto).")
@service_command
def compose(settings: Settings, out_dir: Path, run_id: str, gpus: int, time_scale: float,
            wheel: Path | None, image: str | None, kafka_image: str, s3_image: str) -> None:
    """A Docker Compose set-up: Kafka, an S3 server, simulated GPUs, workers, sink.

    \b
    Example:
      tokenmill dev images    # the base, Kafka and S3 images, from Debian and Maven Central
      tokenmill deploy compose --out stack --gpus 2
      podman-compose -f stack/compose.yaml up --build
    """
    tag = package_version()
    requirement = f"tokenmill=={tag}"
    if wheel is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, out_dir / wheel.name)
        requirement = f"/opt/tokenmill/context/{wheel.name}"
    _write(out_dir, compose_files(run=run_id, gpus=gpus, time_scale=time_scale,
                                  requirement=requirement, image=image or f"tokenmill:{tag}",
                                  cluster_id=kraft.new_cluster_id(), kafka_image=kafka_image,
                                  s3_image=s3_image))
    console.print(f"\nStart it: docker compose -f {out_dir / 'compose.yaml'} up --build")
