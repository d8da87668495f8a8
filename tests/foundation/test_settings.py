import io
import json

import pytest
from click.testing import CliRunner

from tokenmill import log
from tokenmill.cli import cli
from tokenmill.settings import Secret, SettingsError, load_settings


def test_flag_wins_over_environment_and_default() -> None:
    settings = load_settings(
        {"bootstrap_servers": "flag:1"},
        {"TOKENMILL_BOOTSTRAP_SERVERS": "env:2", "TOKENMILL_S3_PREFIX": "p/"},
    )
    assert settings.bootstrap_servers == "flag:1"
    assert settings.s3_prefix == "p/"
    assert settings.s3_region == "us-east-1"


def test_malformed_environment_value_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="TOKENMILL_CONNECT_TIMEOUT_S"):
        load_settings({}, {"TOKENMILL_CONNECT_TIMEOUT_S": "soon"})


def test_malformed_flag_value_names_the_flag() -> None:
    with pytest.raises(SettingsError, match="--security-protocol"):
        load_settings({"security_protocol": "TLS9"}, {})


def test_malformed_bootstrap_names_the_variable_it_came_from() -> None:
    with pytest.raises(SettingsError, match="for TOKENMILL_BOOTSTRAP_SERVERS: expected host:port"):
        load_settings({}, {"TOKENMILL_BOOTSTRAP_SERVERS": "no-port-here"})


def test_sasl_needs_a_mechanism() -> None:
    with pytest.raises(SettingsError, match="--sasl-mechanism"):
        load_settings({"security_protocol": "SASL_SSL"}, {})


def test_cli_reports_malformed_variable_without_traceback() -> None:
    result = CliRunner().invoke(
        cli, ["runs", "list"], env={"TOKENMILL_CONNECT_TIMEOUT_S": "abc"}
    )
    assert result.exit_code == 2
    assert "TOKENMILL_CONNECT_TIMEOUT_S" in result.output
    assert "Traceback" not in result.output


def test_secret_never_prints() -> None:
    settings = load_settings(
        {}, {"TOKENMILL_SASL_PASSWORD": "hunter2", "TOKENMILL_SASL_MECHANISM": "PLAIN",
             "TOKENMILL_SASL_USERNAME": "u", "TOKENMILL_SECURITY_PROTOCOL": "SASL_SSL"}
    )
    assert isinstance(settings.sasl_password, Secret)
    assert settings.sasl_password.reveal() == "hunter2"
    for text in (repr(settings), str(settings), json.dumps(settings.redacted())):
        assert "hunter2" not in text


def test_log_lines_mask_secret_keys() -> None:
    stream = io.StringIO()
    log.configure("info", "json", stream=stream)
    log.get_logger("t").info("connecting", sasl_password="hunter2", aws_secret_access_key="k")
    line = json.loads(stream.getvalue())
    assert line["sasl_password"] == "***"
    assert line["aws_secret_access_key"] == "***"
    assert "hunter2" not in stream.getvalue()


def test_the_sglang_api_key_is_a_secret_that_never_prints(monkeypatch) -> None:
    from consumer.config import WorkerConfig
    from tokenmill.settings import sglang_api_key

    monkeypatch.delenv("TOKENMILL_SGLANG_API_KEY", raising=False)
    assert sglang_api_key() is None
    monkeypatch.setenv("TOKENMILL_SGLANG_API_KEY", "sk-very-secret")
    key = sglang_api_key()
    assert key is not None and key.reveal() == "sk-very-secret"
    config = WorkerConfig(instance="w", sglang_url="http://x", api_key=key)
    assert "sk-very-secret" not in repr(config) and "sk-very-secret" not in str(key)


async def test_the_sglang_client_sends_the_revealed_key() -> None:
    from consumer.sglang_client import SGLangClient
    from tokenmill.settings import Secret

    async with SGLangClient("http://127.0.0.1:1", api_key=Secret("sk-1")) as client:
        assert client._headers["Authorization"] == "Bearer sk-1"
