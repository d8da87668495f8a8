"""Bad settings and arguments across the commands: each is refused with one
line on stderr, `Error: ...` naming the flag or variable (or the dependency
and its address), exit code 2 for usage and 1 for the environment, and never
a traceback.

Every case runs `tokenmill` in a process of its own, with its own
environment, working directory, stderr and exit code. The cases without a
broker are forked from one interpreter that imported the commands once
(tests/forked_cli.py: 76 interpreter starts cost more CPU than all the
rest of this file); the broker cases run `python -m tokenmill.cli` as a
fresh subprocess each. The base environment points Kafka at an unused port
with a 1 s connect timeout and no start-up wait, so a usage case that
reached the network by mistake would fail with exit code 1 and a Kafka line
instead of the expected one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devstack.processes import free_port
from schemas import GenerationSettings, RunSpec, S3Destination
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

REPO = Path(__file__).resolve().parents[2]
USAGE, ENVIRONMENT = 2, 1


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    names: str  # the flag, variable or dependency the one line must name
    code: int = USAGE
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    code: int
    stderr: str


# Placeholders filled per session: {file} an existing regular file, {dir} a
# scratch directory, {port} a port nothing listens on.
CONSUME = ("consume", "--run", "r1", "--sglang-url", "http://127.0.0.1:30000")
PRODUCE = ("produce", "{file}", "--run", "r1", "--gpus", "1")
SINK = ("sink", "--run", "r1")

CASES: tuple[Case, ...] = (
    # --- shared settings, from the environment --------------------------------
    Case("connect-timeout-zero", ("status", "--run", "r1"), "TOKENMILL_CONNECT_TIMEOUT_S",
         env={"TOKENMILL_CONNECT_TIMEOUT_S": "0"}),
    Case("connect-timeout-negative", ("runs", "list"), "TOKENMILL_CONNECT_TIMEOUT_S",
         env={"TOKENMILL_CONNECT_TIMEOUT_S": "-5"}),
    Case("connect-timeout-nan", SINK, "TOKENMILL_CONNECT_TIMEOUT_S",
         env={"TOKENMILL_CONNECT_TIMEOUT_S": "nan"}),
    Case("connect-timeout-inf", CONSUME, "TOKENMILL_CONNECT_TIMEOUT_S",
         env={"TOKENMILL_CONNECT_TIMEOUT_S": "inf"}),
    Case("connect-timeout-word", PRODUCE, "TOKENMILL_CONNECT_TIMEOUT_S",
         env={"TOKENMILL_CONNECT_TIMEOUT_S": "soon"}),
    Case("startup-timeout-negative", SINK, "TOKENMILL_STARTUP_TIMEOUT_S",
         env={"TOKENMILL_STARTUP_TIMEOUT_S": "-1"}),
    Case("startup-timeout-nan", CONSUME, "TOKENMILL_STARTUP_TIMEOUT_S",
         env={"TOKENMILL_STARTUP_TIMEOUT_S": "nan"}),
    Case("state-dir-is-a-file", PRODUCE, "TOKENMILL_STATE_DIR",
         env={"TOKENMILL_STATE_DIR": "{file}"}),
    Case("state-dir-inside-a-file", PRODUCE, "TOKENMILL_STATE_DIR",
         env={"TOKENMILL_STATE_DIR": "{file}/state"}),
    Case("dev-up-state-dir-inside-a-file", ("dev", "up"), "TOKENMILL_STATE_DIR",
         env={"TOKENMILL_STATE_DIR": "{file}/state"}),
    Case("s3-endpoint-garbage", SINK, "TOKENMILL_S3_ENDPOINT_URL",
         env={"TOKENMILL_S3_ENDPOINT_URL": "garbage"}),
    Case("s3-endpoint-ftp", SINK, "TOKENMILL_S3_ENDPOINT_URL",
         env={"TOKENMILL_S3_ENDPOINT_URL": "ftp://127.0.0.1:9000"}),
    Case("s3-bucket-url", SINK, "TOKENMILL_S3_BUCKET", env={"TOKENMILL_S3_BUCKET": "s3://b/x"}),
    Case("s3-region-spaces", SINK, "TOKENMILL_S3_REGION", env={"TOKENMILL_S3_REGION": "US East"}),
    Case("bootstrap-no-port", ("status", "--run", "r1"), "TOKENMILL_BOOTSTRAP_SERVERS",
         env={"TOKENMILL_BOOTSTRAP_SERVERS": "no-port-here"}),
    Case("bootstrap-empty-entry", SINK, "TOKENMILL_BOOTSTRAP_SERVERS",
         env={"TOKENMILL_BOOTSTRAP_SERVERS": "127.0.0.1:9092,,127.0.0.1:9093"}),
    Case("log-level", SINK, "TOKENMILL_LOG_LEVEL", env={"TOKENMILL_LOG_LEVEL": "loud"}),
    Case("log-format", CONSUME, "TOKENMILL_LOG_FORMAT", env={"TOKENMILL_LOG_FORMAT": "xml"}),
    Case("security-protocol", SINK, "TOKENMILL_SECURITY_PROTOCOL",
         env={"TOKENMILL_SECURITY_PROTOCOL": "TLS9"}),
    Case("sasl-without-mechanism", SINK, "--sasl-mechanism",
         env={"TOKENMILL_SECURITY_PROTOCOL": "SASL_SSL"}),
    Case("sasl-mechanism-on-plaintext", CONSUME, "TOKENMILL_SASL_MECHANISM",
         env={"TOKENMILL_SASL_MECHANISM": "PLAIN"}),
    Case("scram-without-password", SINK, "TOKENMILL_SASL_PASSWORD",
         env={"TOKENMILL_SECURITY_PROTOCOL": "SASL_SSL",
              "TOKENMILL_SASL_MECHANISM": "SCRAM-SHA-256", "TOKENMILL_SASL_USERNAME": "u"}),
    Case("ssl-ca-missing", SINK, "TOKENMILL_SSL_CA_LOCATION",
         env={"TOKENMILL_SECURITY_PROTOCOL": "SSL", "TOKENMILL_SSL_CA_LOCATION": "{dir}/none.pem"}),
    # --- shared settings, from flags --------------------------------------------
    Case("s3-endpoint-flag-bad-port", (*SINK, "--s3-endpoint-url", "http://127.0.0.1:99999"),
         "--s3-endpoint-url"),
    Case("bootstrap-flag-port-zero", ("runs", "list", "--bootstrap-servers", "127.0.0.1:0"),
         "--bootstrap-servers"),
    Case("connect-timeout-flag-inf", ("runs", "list", "--connect-timeout-s", "inf"),
         "--connect-timeout-s"),
    Case("startup-timeout-flag-word", (*SINK, "--startup-timeout-s", "later"),
         "--startup-timeout-s"),
    # --- produce ------------------------------------------------------------------
    Case("produce-max-tokens-zero", (*PRODUCE, "--max-tokens", "0"), "--max-tokens"),
    Case("produce-temperature-nan", (*PRODUCE, "--temperature", "nan"), "--temperature"),
    Case("produce-top-p-zero", (*PRODUCE, "--top-p", "0"), "--top-p"),
    Case("produce-top-k-zero", (*PRODUCE, "--top-k", "0"), "--top-k"),
    Case("produce-estimate-inf", (*PRODUCE, "--estimate-rps", "inf"), "--estimate-rps"),
    Case("produce-run-id", ("produce", "{file}", "--run", "bad id!", "--gpus", "1"), "--run"),
    Case("produce-gpus-zero", ("produce", "{file}", "--run", "r1", "--gpus", "0"), "--gpus"),
    Case("produce-rejects-is-a-dir", (*PRODUCE, "--rejects", "{dir}"), "--rejects"),
    # --- consume ------------------------------------------------------------------
    Case("consume-url-not-a-url", ("consume", "--run", "r1", "--sglang-url", "not-a-url"),
         "--sglang-url"),
    Case("consume-url-ftp", ("consume", "--run", "r1", "--sglang-url", "ftp://127.0.0.1:1"),
         "--sglang-url"),
    Case("consume-commit-interval-nan", (*CONSUME, "--commit-interval", "nan"),
         "--commit-interval"),
    Case("consume-request-timeout-negative", (*CONSUME, "--request-timeout", "-1"),
         "--request-timeout"),
    Case("consume-drain-timeout-inf", (*CONSUME, "--drain-timeout", "inf"), "--drain-timeout"),
    Case("consume-retry-base-nan", (*CONSUME, "--retry-base", "nan"), "--retry-base"),
    Case("consume-max-concurrency-zero", (*CONSUME, "--max-concurrency", "0"),
         "--max-concurrency"),
    Case("consume-concurrency-word", (*CONSUME, "--concurrency", "lots"), "--concurrency"),
    Case("consume-metrics-port", (*CONSUME, "--metrics-port", "70000"), "--metrics-port"),
    Case("consume-breaker-max-under-cooldown", (*CONSUME, "--breaker-max-cooldown", "10"),
         "--breaker-max-cooldown"),
    Case("consume-instance", (*CONSUME, "--instance", "gpu 0"), "--instance"),
    # --- sink ---------------------------------------------------------------------
    Case("sink-missing-run", ("sink",), "--run"),
    Case("sink-batch-age-nan", (*SINK, "--max-batch-age", "nan"), "--max-batch-age"),
    Case("sink-batch-bytes-negative", (*SINK, "--max-batch-bytes", "-5MiB"), "--max-batch-bytes"),
    Case("sink-batch-bytes-overflow", (*SINK, "--max-batch-bytes", "1e400"), "--max-batch-bytes"),
    Case("sink-batch-size-zero", (*SINK, "--batch-size", "0"), "--batch-size"),
    Case("sink-session-timeout", (*SINK, "--session-timeout", "0.5"), "--session-timeout"),
    # --- operator commands, dev, demo, simulator --------------------------------------
    Case("status-watch-nan", ("status", "--run", "r1", "--watch", "nan"), "--watch"),
    Case("spot-check-count-zero", ("spot-check", "--run", "r1", "-n", "0"), "-n"),
    Case("spot-check-width", ("spot-check", "--run", "r1", "--width", "0"), "--width"),
    Case("runs-show-run-id", ("runs", "show", "a b"), "RUN_ID"),
    Case("runs-replay-top-p", ("runs", "replay", "r2", "--parent", "r1", "--top-p", "1.5"),
         "--top-p"),
    Case("runs-redrive-temperature", ("runs", "redrive", "r2", "--parent", "r1", "--reasons",
                                      "length", "--temperature", "inf"), "--temperature"),
    Case("dataset-run-id", ("dataset", "a/b"), "RUN_ID"),
    Case("export-shard-records", ("export", "r1", "--format", "openai", "--out", "{dir}/export",
                                  "--shard-records", "0"), "--shard-records"),
    Case("deploy-systemd-port", ("deploy", "systemd", "--out", "{dir}/units", "--run", "r1",
                                 "--sglang-port", "0"), "--sglang-port"),
    Case("deploy-compose-time-scale", ("deploy", "compose", "--out", "{dir}/compose",
                                       "--time-scale", "nan"), "--time-scale"),
    Case("dev-up-port", ("dev", "up", "--kafka-port", "70000"), "--kafka-port"),
    Case("dev-up-heap", ("dev", "up", "--kafka-heap", "lots"), "--kafka-heap"),
    Case("dev-up-same-ports", ("dev", "up", "--kafka-port", "1234", "--s3-port", "1234"),
         "--s3-port"),
    Case("demo-gpus-zero", ("demo", "--gpus", "0"), "--gpus"),
    Case("demo-timeout-nan", ("demo", "--timeout", "nan"), "--timeout"),
    Case("sim-error-rate", ("sim-sglang", "--error-rate", "2"), "--error-rate"),
    Case("sim-decode-rate-nan", ("sim-sglang", "--decode-rate", "nan"), "--decode-rate"),
    Case("sim-port", ("sim-sglang", "--port", "-1"), "--port"),
    Case("sim-log-level", ("sim-sglang", "--log-level", "loud"), "--log-level"),
    # --- the environment: a broker that does not answer, no Java --------------------
    Case("sink-kafka-down", SINK, "Kafka at 127.0.0.1:{port}", ENVIRONMENT),
    Case("consume-kafka-down", CONSUME, "Kafka at 127.0.0.1:{port}", ENVIRONMENT),
    Case("produce-kafka-down", PRODUCE, "Kafka at 127.0.0.1:{port}", ENVIRONMENT),
    Case("status-kafka-down", ("status", "--run", "r1"), "Kafka at 127.0.0.1:{port}",
         ENVIRONMENT),
    Case("produce-input-missing", ("produce", "{dir}/absent.jsonl", "--run", "r1", "--gpus", "1"),
         "absent.jsonl", ENVIRONMENT),
    Case("dev-up-without-java", ("dev", "up", "--kafka-port", "{port}", "--controller-port",
                                 "{port2}", "--s3-port", "{port3}"),
         "java is not on PATH", ENVIRONMENT, env={"PATH": "{dir}/no-bin"}),
)


def base_env(scratch: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENMILL_")}
    env.update({
        "PYTHONPATH": str(REPO),
        "TOKENMILL_STATE_DIR": str(scratch / "state"),
        "TOKENMILL_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "TOKENMILL_CONNECT_TIMEOUT_S": "1",
        "TOKENMILL_STARTUP_TIMEOUT_S": "0",
    })
    return env


def _argv_env(case: Case, env: dict[str, str],
              fill: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    return ([a.format(**fill) for a in case.args],
            {**env, **{k: v.format(**fill) for k, v in case.env.items()}})


def run_case(case: Case, env: dict[str, str], fill: dict[str, str], cwd: Path) -> Outcome:
    args, full_env = _argv_env(case, env, fill)
    result = subprocess.run([sys.executable, "-m", "tokenmill.cli", *args], env=full_env,
                            cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    return Outcome(result.returncode, result.stderr)


def run_forked(cases: tuple[Case, ...], env: dict[str, str], fill: dict[str, str],
               cwd: Path) -> dict[str, Outcome]:
    """Every case in a child of one interpreter (tests/forked_cli.py)."""
    lines = []
    for case in cases:
        args, full_env = _argv_env(case, env, fill)
        lines.append(json.dumps({"id": case.id, "args": args, "env": full_env,
                                 "cwd": str(cwd)}))
    result = subprocess.run([sys.executable, "-m", "tests.forked_cli"], input="\n".join(lines),
                            env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO, capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    answers = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    return {a["id"]: Outcome(a["code"], a["stderr"]) for a in answers}


def assert_one_line_error(case: Case, outcome: Outcome, fill: dict[str, str]) -> None:
    lines = [line for line in outcome.stderr.splitlines() if line.strip()]
    shown = f"{case.id}: exit {outcome.code}, stderr:\n{outcome.stderr}"
    assert "Traceback" not in outcome.stderr, shown
    assert len(lines) == 1, shown
    assert lines[0].startswith("Error: "), shown
    assert case.names.format(**fill) in lines[0], shown
    assert outcome.code == case.code, shown


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad-settings")
    (path / "prompts.jsonl").write_text('{"prompt": "hello"}\n')
    return path


@pytest.fixture(scope="module")
def fill(scratch: Path) -> dict[str, str]:
    return {"file": str(scratch / "prompts.jsonl"), "dir": str(scratch), "port": str(free_port()),
            "port2": str(free_port()), "port3": str(free_port())}


@pytest.fixture(scope="module")
def outcomes(scratch: Path, fill: dict[str, str]) -> dict[str, Outcome]:
    """Every case, forked from one interpreter."""
    found = run_forked(CASES, base_env(scratch, int(fill["port"])), fill, scratch)
    assert set(found) == {case.id for case in CASES}
    return found


def test_the_table_covers_enough_cases() -> None:
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)
    commands = {case.args[0] for case in CASES}
    assert commands >= {"produce", "consume", "sink", "status", "spot-check", "runs", "dev",
                        "demo", "sim-sglang", "dataset", "export", "deploy"}


# One case of each kind: a flag, a variable, a dependency down, a missing tool.
FAITHFUL = ("produce-max-tokens-zero", "log-format", "consume-kafka-down", "dev-up-without-java")


def test_a_forked_case_ends_as_it_does_in_a_fresh_interpreter(
        scratch: Path, fill: dict[str, str], outcomes: dict[str, Outcome]) -> None:
    """The fork is faithful: the same exit code and the same stderr, byte
    for byte, as `python -m tokenmill.cli` in a subprocess of its own."""
    env = base_env(scratch, int(fill["port"]))
    for case in (c for c in CASES if c.id in FAITHFUL):
        fresh = run_case(case, env, fill, scratch)
        assert outcomes[case.id] == fresh, (case.id, outcomes[case.id], fresh)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_setting_is_one_line_with_the_right_exit_code(
        case: Case, outcomes: dict[str, Outcome], fill: dict[str, str]) -> None:
    assert_one_line_error(case, outcomes[case.id], fill)


# Cases that need a broker holding a registered run, to get as far as S3 or
# the SGLang server; what they need is on an unused port.
BROKER_CASES: tuple[Case, ...] = (
    Case("sink-s3-down", ("sink", "--run", "{run}"), "S3 at http://127.0.0.1:{port}",
         ENVIRONMENT, env={"TOKENMILL_S3_ENDPOINT_URL": "http://127.0.0.1:{port}"}),
    Case("sink-bucket-missing", ("sink", "--run", "{run}", "--no-create-bucket"),
         "--create-bucket", ENVIRONMENT),
    Case("consume-sglang-down", ("consume", "--run", "{run}", "--sglang-url",
                                 "http://127.0.0.1:{port}"),
         "the SGLang server at http://127.0.0.1:{port}", ENVIRONMENT),
)


@pytest.mark.broker
@pytest.mark.parametrize("case", BROKER_CASES, ids=[case.id for case in BROKER_CASES])
def test_a_dependency_that_is_down_is_one_line_with_exit_code_1(
        case: Case, settings: Settings, run_id: str, scratch: Path, fill: dict[str, str]) -> None:
    RunRegistry(settings).create_run(RunSpec(
        run_id=run_id, partitions=1, generation=GenerationSettings(model="m", max_tokens=64),
        s3=S3Destination(bucket=settings.s3_bucket or "b")))
    env = base_env(scratch, 0)
    env.update({"TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
                "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
                "TOKENMILL_CONNECT_TIMEOUT_S": "10"})
    full_fill = {**fill, "run": run_id}
    outcome = run_case(case, env, full_fill, scratch)
    assert_one_line_error(case, outcome, full_fill)
