"""The `tokenmill sink` command line: flags, and errors as one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.sink.sink_helpers import REPO, create_run, make_spec, sink_env


def _sink(*args: str, env=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "sink", *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
                          env=env)


def test_help_lists_the_flags() -> None:
    out = _sink("--help")
    assert out.returncode == 0
    for flag in ("--run", "--batch-size", "--max-batch-bytes", "--max-batch-age", "--instance",
                 "--until-done", "--metrics-port", "--compression", "--create-bucket",
                 "--session-timeout", "--s3-bucket", "--s3-prefix", "--s3-endpoint-url"):
        assert flag in out.stdout, flag


def test_bad_values_are_refused_naming_the_flag() -> None:
    out = _sink("--run", "r", "--max-batch-bytes", "lots")
    assert out.returncode == 2 and "--max-batch-bytes" in out.stderr
    out = _sink("--run", "r", "--batch-size", "0")
    assert out.returncode == 2 and "--batch-size" in out.stderr


@pytest.mark.broker
def test_unknown_run_and_missing_bucket_are_one_line_errors(settings, run_id) -> None:
    env = sink_env(settings)
    out = _sink("--run", run_id, env=env)
    assert out.returncode == 1 and f"run '{run_id}' is not registered" in out.stderr
    assert "Traceback" not in out.stderr
    create_run(settings, make_spec(run_id))
    env["TOKENMILL_S3_BUCKET"] = ""
    out = _sink("--run", run_id, env=env)
    assert out.returncode == 1 and "no S3 bucket" in out.stderr and "Traceback" not in out.stderr
    env["TOKENMILL_S3_BUCKET"] = settings.s3_bucket
    out = _sink("--run", run_id, "--no-create-bucket", env=env)
    assert out.returncode == 1 and "--create-bucket" in out.stderr
