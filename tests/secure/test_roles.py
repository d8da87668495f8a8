"""On the secured broker, with exactly the ACLs `tokenmill deploy acls`
grants a run: each role is refused what it must not do, and a wrong
password or an unknown CA ends a command with one `Error:` line within the
connect timeout, without the secret in any output or `--help`."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devstack import secure
from ops.acls import apply_acls
from schemas import GenerationSettings, RunSpec
from tests.secure.conftest import SecureServices
from tokenmill.cli import cli
from tokenmill.kafka import acls, topics
from tokenmill.registry import RunRegistry

pytestmark = [pytest.mark.broker]

# Long, so that a command that waits it out (the failure this guards
# against) is told apart from one that stops at the refusal, on any machine.
CONNECT_TIMEOUT_S = 30.0


def new_run(services: SecureServices) -> str:
    """A run whose ACLs are granted (as admin, exactly `deploy acls --run`'s)
    and whose topics the producer created."""
    run_id = f"t{uuid.uuid4().hex[:12]}"
    apply_acls(services.settings("admin"), acls.role_acls(acls.Scope(run=run_id)))
    spec = RunSpec(run_id=run_id, partitions=2,
                   generation=GenerationSettings(model="sim", max_tokens=64))
    RunRegistry(services.settings("producer")).create_run(spec)
    return run_id


@pytest.fixture(scope="module")
def run_id(secure_services: SecureServices) -> str:
    return new_run(secure_services)


def produce_error(services: SecureServices, role: str, topic: str) -> str | None:
    """The delivery error of one plain (non-idempotent) record, or None."""
    errors: list[KafkaError] = []
    producer = Producer({**services.librdkafka(role), "enable.idempotence": False,
                         "message.timeout.ms": 10_000})
    producer.produce(topic, b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    return errors[0].name() if errors and errors[0] is not None else None


def join_error(services: SecureServices, role: str, group: str, topic: str) -> str | None:
    """The first error of a consumer of `role` joining `group` on `topic`
    (KIP-848 reports a refused join as a fatal error: its text says why)."""
    consumer = Consumer({**services.librdkafka(role), "group.id": group,
                         "group.protocol": "consumer", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                error = message.error()
                if "Group authorization failed" in error.str():
                    return "GROUP_AUTHORIZATION_FAILED"
                return str(error.name())
            if consumer.assignment():
                return None
        return None
    finally:
        consumer.close()


def init_transactions_error(services: SecureServices, role: str, transactional_id: str
                            ) -> str | None:
    producer = Producer({**services.librdkafka(role), "transactional.id": transactional_id})
    try:
        producer.init_transactions(15)
    except KafkaException as exc:
        return str(exc.args[0].name())
    return None


def fetch_error(services: SecureServices, role: str, topic: str) -> str | None:
    """The first error of an assign-only read of partition 0 (no group use):
    the topic's metadata (a topic one may not describe is refused there),
    then the fetch."""
    consumer = Consumer({**services.librdkafka(role), "group.id": acls.COMPACTED_READER_GROUP,
                         "enable.partition.eof": True})
    try:
        described = consumer.list_topics(topic, timeout=15).topics[topic]
        if described.error is not None:
            return str(described.error.name())
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return None
                return str(message.error().name())
        return None
    finally:
        consumer.close()


def test_a_worker_cannot_write_the_prompts_or_use_the_producers_id(
        secure_services: SecureServices, run_id: str) -> None:
    assert produce_error(secure_services, "worker", topics.prompts_topic(run_id)) == \
        "TOPIC_AUTHORIZATION_FAILED"
    assert produce_error(secure_services, "worker", topics.dlq_topic(run_id)) == \
        "TOPIC_AUTHORIZATION_FAILED"
    assert init_transactions_error(secure_services, "worker",
                                   topics.transactional_id(run_id, "producer")) == \
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    assert join_error(secure_services, "worker", topics.sink_group(run_id),
                      topics.completions_topic(run_id)) == "GROUP_AUTHORIZATION_FAILED"
    # What it needs works: its own transactional id, the completions topic.
    assert init_transactions_error(secure_services, "worker",
                                   topics.transactional_id(run_id, "consumer", "w0")) is None
    assert produce_error(secure_services, "worker", topics.completions_topic(run_id)) is None


def test_the_reader_cannot_write_anything(secure_services: SecureServices, run_id: str) -> None:
    for topic in (topics.RUNS_TOPIC, topics.prompts_topic(run_id),
                  topics.completions_topic(run_id), topics.dlq_topic(run_id),
                  topics.progress_topic(run_id)):
        assert produce_error(secure_services, "reader", topic) == "TOPIC_AUTHORIZATION_FAILED", \
            topic
    for transactional_id in (topics.transactional_id(run_id, "producer"),
                             topics.transactional_id(run_id, "consumer", "w0"),
                             topics.transactional_id(run_id, "sink", "s0")):
        assert init_transactions_error(secure_services, "reader", transactional_id) == \
            "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
    # Joining a group could commit offsets (skip prompts): refused.
    assert join_error(secure_services, "reader", topics.generate_group(run_id),
                      topics.prompts_topic(run_id)) == "GROUP_AUTHORIZATION_FAILED"
    admin = AdminClient(secure_services.librdkafka("reader"))
    created = admin.create_topics([NewTopic(f"tokenmill.{run_id}.extra", 1, 1)],
                                  request_timeout=15)
    with pytest.raises(KafkaException) as refused:
        created[f"tokenmill.{run_id}.extra"].result()
    assert refused.value.args[0].name() == "TOPIC_AUTHORIZATION_FAILED"
    # What it needs works: reading the run.
    assert fetch_error(secure_services, "reader", topics.completions_topic(run_id)) is None


def test_the_sink_and_producer_keep_to_their_part(secure_services: SecureServices,
                                                  run_id: str) -> None:
    assert produce_error(secure_services, "sink", topics.completions_topic(run_id)) == \
        "TOPIC_AUTHORIZATION_FAILED"
    assert fetch_error(secure_services, "sink", topics.prompts_topic(run_id)) == \
        "TOPIC_AUTHORIZATION_FAILED"
    assert join_error(secure_services, "producer", topics.generate_group(run_id),
                      topics.prompts_topic(run_id)) == "GROUP_AUTHORIZATION_FAILED"
    assert produce_error(secure_services, "producer", topics.completions_topic(run_id)) == \
        "TOPIC_AUTHORIZATION_FAILED"


def test_one_runs_grants_reach_nothing_of_another_run(secure_services: SecureServices,
                                                      run_id: str) -> None:
    """Run B's worker ACLs go to another principal: the worker of `run_id`
    gets nothing of B's (every name it was granted starts with
    `tokenmill.<run_id>.`, run ids have no dots)."""
    other = f"t{uuid.uuid4().hex[:12]}"
    apply_acls(secure_services.settings("admin"), acls.role_acls(
        acls.Scope(run=other), {"worker": "User:another-worker"}))
    RunRegistry(secure_services.settings("producer")).create_run(RunSpec(
        run_id=other, partitions=2, generation=GenerationSettings(model="sim", max_tokens=64)))
    assert fetch_error(secure_services, "worker", topics.prompts_topic(other)) == \
        "TOPIC_AUTHORIZATION_FAILED"
    assert join_error(secure_services, "worker", topics.generate_group(other),
                      topics.prompts_topic(other)) == "GROUP_AUTHORIZATION_FAILED"
    assert init_transactions_error(secure_services, "worker",
                                   topics.transactional_id(other, "consumer", "w0")) == \
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"


# --- wrong password, unknown CA, secrets ------------------------------------


def run_cli(services: SecureServices, role: str, args: list[str], *, tmp_path: Path,
            **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", *args],
        env=services.env(role, TOKENMILL_CONNECT_TIMEOUT_S=str(CONNECT_TIMEOUT_S),
                         TOKENMILL_STARTUP_TIMEOUT_S="120", TOKENMILL_LOG_LEVEL="debug",
                         TOKENMILL_LOG_FORMAT="json", TOKENMILL_STATE_DIR=str(tmp_path / "state"),
                         TOKENMILL_S3_BUCKET="tokenmill", AWS_ACCESS_KEY_ID="testing",
                         AWS_SECRET_ACCESS_KEY="testing", **env),
        capture_output=True, text=True, timeout=120)
    return result, time.monotonic() - started


def commands(run_id: str, tmp_path: Path) -> dict[str, list[str]]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    return {
        "produce": ["produce", str(prompts), "--run", run_id, "--gpus", "1", "--no-progress"],
        "consume": ["consume", "--run", run_id, "--sglang-url", "http://127.0.0.1:9",
                    "--instance", "w0"],
        "sink": ["sink", "--run", run_id, "--instance", "s0"],
        "status": ["status", "--run", run_id],
    }


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    return errors[0]


@pytest.mark.parametrize("command", ["produce", "consume", "sink", "status"])
def test_a_wrong_password_is_one_error_line_within_the_connect_timeout(
        secure_services: SecureServices, run_id: str, tmp_path: Path, command: str) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    role = {"produce": "producer", "consume": "worker", "sink": "sink",
            "status": "reader"}[command]
    result, took = run_cli(secure_services, role, commands(run_id, tmp_path)[command],
                           tmp_path=tmp_path, TOKENMILL_SASL_PASSWORD=wrong)
    line = one_error_line(result)
    assert f"refused the credentials of '{role}'" in line, line
    assert took < CONNECT_TIMEOUT_S, f"{took:.1f}s"
    assert wrong not in result.stdout + result.stderr


@pytest.mark.parametrize("command", ["consume", "status"])
def test_an_unknown_ca_is_one_error_line_within_the_connect_timeout(
        secure_services: SecureServices, run_id: str, tmp_path: Path, command: str) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(secure.make_certificates(["127.0.0.1"])[0])
    role = "worker" if command == "consume" else "reader"
    result, took = run_cli(secure_services, role, commands(run_id, tmp_path)[command],
                           tmp_path=tmp_path, TOKENMILL_SSL_CA_LOCATION=str(other_ca))
    line = one_error_line(result)
    assert "TLS handshake" in line and "certificate verify failed" in line, line
    assert took < CONNECT_TIMEOUT_S, f"{took:.1f}s"
    assert secure_services.password(role) not in result.stdout + result.stderr


def test_no_secret_in_help_or_in_a_working_commands_logs(secure_services: SecureServices,
                                                         run_id: str, tmp_path: Path) -> None:
    secret = secure_services.password("reader")
    environment = secure_services.env("reader", TOKENMILL_SASL_PASSWORD=secret)
    for args in (["--help"], ["consume", "--help"], ["sink", "--help"], ["status", "--help"],
                 ["dev", "up", "--help"], ["deploy", "acls", "--help"]):
        shown = CliRunner().invoke(cli, [*args[:-1], "--sasl-password", secret, "--help"]
                                   if args != ["--help"] else args, env=environment)
        assert shown.exit_code == 0, shown.output
        assert secret not in shown.output
    result, _ = run_cli(secure_services, "reader", ["status", "--run", run_id, "--json"],
                        tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert secret not in result.stdout + result.stderr


def test_deploy_acls_apply_needs_alter_on_the_cluster(secure_services: SecureServices,
                                                      tmp_path: Path) -> None:
    """Only admin may grant: a role applying ACLs gets one line."""
    result, _ = run_cli(secure_services, "worker",
                        ["deploy", "acls", "--run", "tnever", "--apply"], tmp_path=tmp_path)
    line = one_error_line(result)
    assert "would not create the ACLs as 'worker'" in line, line
