"""`tokenmill deploy systemd|compose --out DIR` writes the shipped files,
filled in from flags and settings, as a user runs it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ops import deploy
from tests.tools import require_on_path
from tokenmill import deploy_files
from tokenmill.settings import Settings


def tokenmill(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOKENMILL_")}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**clean, **(env or {})})


def _properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line.strip() and not line.startswith("#"))


def test_systemd_files_for_gpu_hosts_and_a_three_node_kafka(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = tokenmill(
        "deploy", "systemd", "--out", str(out), "--run", "qwen-r1", "--gpus", "12",
        "--kafka-hosts", "kafka-1,kafka-2,kafka-3",
        "--bootstrap-servers", "kafka-1:9092,kafka-2:9092,kafka-3:9092",
        "--s3-bucket", "my-data", "--s3-prefix", "drafter/", "--install-dir", "/opt/tm",
        "--user", "svc", "--model", "Qwen/Qwen3-32B",
        env={"TOKENMILL_SASL_PASSWORD": "hunter2-secret"})
    assert result.returncode == 0, result.stderr
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert written == sorted(
        ["systemd/sglang@.service", "systemd/tokenmill-consume@.service",
         "systemd/tokenmill-sink@.service", "systemd/tokenmill-gpus.target",
         "systemd/tokenmill-kafka.service", "etc/tokenmill.env", "etc/sglang.env",
         "etc/sink-qwen-r1.env",
         "kafka/pom.xml", "kafka/log4j2.properties"]
        + [f"etc/gpu-{i}.env" for i in range(12)]
        + [f"kafka/kafka-{i}/server.properties" for i in (1, 2, 3)])
    for path in out.rglob("*"):
        if path.is_file():
            assert deploy_files.placeholders(path.read_text()) == set(), path

    env_file = out / "etc/tokenmill.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    env_lines = [line for line in env_file.read_text().splitlines() if not line.startswith("#")]
    assert env_lines == ["TOKENMILL_RUN=qwen-r1",
                         "TOKENMILL_BOOTSTRAP_SERVERS=kafka-1:9092,kafka-2:9092,kafka-3:9092",
                         "TOKENMILL_S3_BUCKET=my-data", "TOKENMILL_S3_PREFIX=drafter/",
                         "TOKENMILL_LOG_FORMAT=json"]
    assert "hunter2" not in "".join(p.read_text() for p in out.rglob("*") if p.is_file())

    # GPU 11 gets its own ports (a unit's %i cannot do arithmetic: 3000%i would be 300011).
    assert (out / "etc/gpu-11.env").read_text().splitlines()[1:] == [
        "CUDA_VISIBLE_DEVICES=11", "SGLANG_PORT=30011", "METRICS_PORT=9111"]
    target = (out / "systemd/tokenmill-gpus.target").read_text()
    wants = next(line for line in target.splitlines() if line.startswith("Wants="))
    assert wants.split("=", 1)[1].split() == [
        unit for i in range(12)
        for unit in (f"sglang@{i}.service", f"tokenmill-consume@{i}.service")]
    consume = (out / "systemd/tokenmill-consume@.service").read_text()
    assert "ExecStart=/opt/tm/bin/tokenmill consume --run ${TOKENMILL_RUN}" in consume
    assert "User=svc" in consume and "EnvironmentFile=/etc/tokenmill/gpu-%i.env" in consume
    assert "MODEL_PATH=Qwen/Qwen3-32B" in (out / "etc/sglang.env").read_text()
    sink = (out / "systemd/tokenmill-sink@.service").read_text()
    assert "ExecStart=/opt/tm/bin/tokenmill sink --run %i " in sink
    assert "EnvironmentFile=/etc/tokenmill/sink-%i.env" in sink
    assert "SINK_METRICS_PORT=9200" in (out / "etc/sink-qwen-r1.env").read_text().splitlines()

    configs = {i: _properties(out / f"kafka/kafka-{i}/server.properties") for i in (1, 2, 3)}
    assert {c["node.id"] for c in configs.values()} == {"1", "2", "3"}
    assert {c["controller.quorum.voters"] for c in configs.values()} == {
        "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}
    assert all(c["default.replication.factor"] == "3" and c["min.insync.replicas"] == "2"
               for c in configs.values())
    # The one cluster id every node is formatted with is in the unit's instructions.
    unit = (out / "systemd/tokenmill-kafka.service").read_text()
    cluster_id = unit.split("--cluster-id=")[1].split()[0]
    assert all(f"--cluster-id={cluster_id}" in (out / f"kafka/kafka-{i}/server.properties")
               .read_text() for i in (1, 2, 3))


def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    require_on_path("systemd-analyze")
    out = tmp_path / "out"
    result = tokenmill("deploy", "systemd", "--out", str(out), "--run", "r", "--gpus", "2",
                       "--s3-bucket", "b", "--user", "root", "--kafka-hosts", "k1",
                       "--install-dir", sys.prefix)
    assert result.returncode == 0, result.stderr
    units = out / "systemd"
    shutil.copy(units / "sglang@.service", units / "sglang@0.service")
    shutil.copy(units / "tokenmill-consume@.service", units / "tokenmill-consume@0.service")
    shutil.copy(units / "tokenmill-sink@.service", units / "tokenmill-sink@r.service")
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(units / name) for name in (
            "sglang@0.service", "tokenmill-consume@0.service", "tokenmill-sink@r.service",
            "tokenmill-kafka.service"))],
        capture_output=True, text=True, timeout=60)
    problems = [line for line in verify.stderr.splitlines()
                if "tokenmill" in line or "sglang" in line]
    assert verify.returncode == 0 and not problems, verify.stderr


def _env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines()
                if line.strip() and not line.startswith("#"))


def test_sglang_env_carries_the_seed_runs_flags_and_mtp_only_when_asked() -> None:
    settings = Settings(s3_bucket="b")
    plan = deploy.SystemdPlan(run="r", gpus=1, install_dir="/opt", user="u", model="m")
    files = {f.path: f.text for f in deploy.systemd_files(plan, settings)}
    env = _env(files["etc/sglang.env"])
    args = env["SGLANG_ARGS"].split()
    for flag, value in (("--mem-fraction-static", "0.93"), ("--max-running-requests", "64"),
                        ("--reasoning-parser", "qwen3"), ("--tool-call-parser", "qwen25")):
        assert args[args.index(flag) + 1] == value
    assert env["SGLANG_SPECULATIVE_ARGS"] == ""  # a model without MTP layers
    unit = files["systemd/sglang@.service"]
    assert "$SGLANG_ARGS $SGLANG_SPECULATIVE_ARGS" in unit  # unbraced: systemd splits them

    with_mtp = {f.path: f.text for f in deploy.systemd_files(
        deploy.SystemdPlan(run="r", gpus=1, install_dir="/opt", user="u", model="m", mtp=True),
        settings)}
    speculative = _env(with_mtp["etc/sglang.env"])["SGLANG_SPECULATIVE_ARGS"].split()
    assert dict(zip(speculative[::2], speculative[1::2])) == {
        "--speculative-algorithm": "NEXTN", "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4"}


def test_a_replays_sink_runs_beside_its_parents_on_its_own_port(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for run, port in (("parent", "9200"), ("parent-replay", "9201")):
        result = tokenmill("deploy", "systemd", "--out", str(out), "--run", run,
                           "--s3-bucket", "b", "--sink-metrics-port", port, "--mtp")
        assert result.returncode == 0, result.stderr
        assert f"tokenmill-sink@{run}" in result.stderr
    assert _env((out / "etc/sink-parent.env").read_text()) == {"SINK_METRICS_PORT": "9200"}
    assert _env((out / "etc/sink-parent-replay.env").read_text()) == {
        "SINK_METRICS_PORT": "9201"}
    assert "--speculative-algorithm NEXTN" in (out / "etc/sglang.env").read_text()


def test_monitoring_writes_the_rules_config_and_dashboard_as_shipped(tmp_path: Path) -> None:
    result = tokenmill("deploy", "monitoring", "--out", str(tmp_path / "m"))
    assert result.returncode == 0, result.stderr
    written = sorted(str(p.relative_to(tmp_path / "m")) for p in (tmp_path / "m").rglob("*")
                     if p.is_file())
    assert written == ["grafana/tokenmill.json", "prometheus/alerts.yml",
                       "prometheus/prometheus.yml"]
    for path in written:
        assert (tmp_path / "m" / path).read_text() == deploy_files.read_text(f"deploy/{path}")


def test_systemd_needs_a_bucket_and_a_run(tmp_path: Path) -> None:
    result = tokenmill("deploy", "systemd", "--out", str(tmp_path), "--run", "r")
    assert result.returncode != 0 and "--s3-bucket" in result.stderr
    assert "Traceback" not in result.stderr
    written = tokenmill("deploy", "systemd", "--out", str(tmp_path), "--s3-bucket", "b")
    assert written.returncode != 0


def test_compose_with_three_simulated_gpus_and_a_local_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "tokenmill-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    out = tmp_path / "stack"
    result = tokenmill("deploy", "compose", "--out", str(out), "--gpus", "3", "--run", "r7",
                       "--wheel", str(wheel))
    assert result.returncode == 0, result.stderr
    assert (out / wheel.name).read_bytes() == b"not really a wheel"
    dockerfile = (out / "Dockerfile").read_text()
    assert f"pip install --no-cache-dir /opt/tokenmill/context/{wheel.name}" in dockerfile
    doc = yaml.safe_load((out / "compose.yaml").read_text())
    services = doc["services"]
    assert set(services) == {"kafka", "s3", "tokenmill", "sink"} | {
        f"{kind}-gpu{i}" for kind in ("sim", "consume") for i in range(3)}
    for i in range(3):
        command = services[f"consume-gpu{i}"]["command"]
        assert f"--sglang-url http://sim-gpu{i}:30000" in command and "--run r7" in command
        assert services[f"consume-gpu{i}"]["environment"]["TOKENMILL_BOOTSTRAP_SERVERS"] == \
            "kafka:9092"
    assert "--run r7" in services["sink"]["command"]
    kafka_env = services["kafka"]["environment"]
    # The broker gets the same settings as the dev stack's server.properties.
    assert kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka:9093"
    assert kafka_env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    assert kafka_env["KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS"] == "3000"
    assert kafka_env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert kafka_env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    # The images `tokenmill dev images` builds, by default (no registry needed).
    assert services["kafka"]["image"] == "localhost/tokenmill-kafka:local"
    assert services["s3"]["image"] == "localhost/tokenmill-s3:local"
    assert services["sink"]["environment"]["TOKENMILL_S3_ENDPOINT_URL"] == "http://s3:9000"
    assert dockerfile.splitlines()[dockerfile.splitlines().index(
        "ARG BASE_IMAGE=localhost/tokenmill-base:local") + 1] == "FROM ${BASE_IMAGE}"


def test_compose_takes_the_images_it_is_given(tmp_path: Path) -> None:
    result = tokenmill("deploy", "compose", "--out", str(tmp_path), "--image", "tm:1",
                       "--kafka-image", "k:2", "--s3-image", "s:3")
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load((tmp_path / "compose.yaml").read_text())["services"]
    assert (services["sink"]["image"], services["kafka"]["image"], services["s3"]["image"]) == \
        ("tm:1", "k:2", "s:3")


def test_compose_installs_the_released_package_by_default(tmp_path: Path) -> None:
    result = tokenmill("deploy", "compose", "--out", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    assert f"pip install --no-cache-dir tokenmill=={deploy.package_version()}" in \
        (tmp_path / "s" / "Dockerfile").read_text()


def test_kafka_image_variables_follow_the_image_naming() -> None:
    env = deploy.kafka_image_environment("# c\nnode.id=1\nlog.dirs=/x\nsome_key.name=v\n\n")
    assert env == {"KAFKA_NODE_ID": "1", "KAFKA_LOG_DIRS": "/x", "KAFKA_SOME__KEY_NAME": "v"}


def test_env_file_carries_non_default_settings_and_never_a_secret() -> None:
    from tokenmill.settings import Secret

    settings = Settings(bootstrap_servers="k:9092", s3_bucket="b", security_protocol="SASL_SSL",
                        sasl_mechanism="SCRAM-SHA-512", sasl_username="u",
                        sasl_password=Secret("pw-123"), s3_endpoint_url="https://minio:9000")
    text = deploy.env_file_settings(settings, "r")
    assert "pw-123" not in text
    assert text.splitlines() == [
        "TOKENMILL_RUN=r", "TOKENMILL_BOOTSTRAP_SERVERS=k:9092",
        "TOKENMILL_SECURITY_PROTOCOL=SASL_SSL", "TOKENMILL_SASL_MECHANISM=SCRAM-SHA-512",
        "TOKENMILL_SASL_USERNAME=u", "TOKENMILL_S3_ENDPOINT_URL=https://minio:9000",
        "TOKENMILL_S3_BUCKET=b", "TOKENMILL_LOG_FORMAT=json",
        "# TOKENMILL_SASL_PASSWORD=   (the secret: write it here by hand)"]


# The Compose Specification's JSON Schema, from compose-spec/compose-go
# v2.16.2 (schema/compose-spec.json, Apache-2.0), the schema `docker compose`
# itself validates files with. Here because no Docker engine runs here.
COMPOSE_SPEC = Path(__file__).with_name("compose-spec.json")


def test_compose_files_follow_the_compose_specification(tmp_path: Path) -> None:
    import jsonschema

    schema = json.loads(COMPOSE_SPEC.read_text())
    out = tmp_path / "stack"
    result = tokenmill("deploy", "compose", "--out", str(out), "--gpus", "2", "--run", "r9")
    assert result.returncode == 0, result.stderr
    documents = {"compose.yaml": yaml.safe_load((out / "compose.yaml").read_text())}
    for extra in sorted(out.glob("compose-*.yaml")):
        documents[extra.name] = yaml.safe_load(extra.read_text())
    for name, document in documents.items():
        jsonschema.validate(document, schema)  # raises, naming the path, on a violation
    # The sink creates its bucket (the S3 server starts empty; it must not crash-loop).
    assert "--create-bucket" in documents["compose.yaml"]["services"]["sink"]["command"]
    # ...and the schema is strict enough to catch a typo'd service key.
    broken = dict(documents["compose.yaml"])
    broken["services"] = {**broken["services"], "sink": {**broken["services"]["sink"],
                                                        "restart_policy": "on-failure"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
