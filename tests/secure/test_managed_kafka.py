"""Settings for a managed Kafka (no broker): the security properties file
(`--kafka-properties`: OAUTHBEARER/OIDC and other librdkafka sasl.*/ssl.*
properties), and the one line a refusal becomes, without secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from tokenmill.kafka import clients
from tokenmill.settings import Secret, Settings, SettingsError, load_settings

OIDC = """# Confluent Cloud, OAuth (OIDC client credentials)
sasl.oauthbearer.method=oidc
sasl.oauthbearer.client.id=tokenmill-workers
sasl.oauthbearer.client.secret=very-secret-value
sasl.oauthbearer.token.endpoint.url=https://idp.example/oauth2/token
sasl.oauthbearer.extensions=logicalCluster=lkc-abc123,identityPoolId=pool-xyz
"""


def test_a_properties_file_reaches_every_client_and_no_message(tmp_path: Path) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text(OIDC)
    settings = load_settings({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                              "kafka_properties": str(path)}, environ={})
    config = clients.base_config(settings)
    assert config["sasl.oauthbearer.method"] == "oidc"
    assert config["sasl.oauthbearer.extensions"] == (
        "logicalCluster=lkc-abc123,identityPoolId=pool-xyz")
    assert "very-secret-value" not in repr(settings.redacted())
    assert settings.redacted()["kafka_properties"] == str(path)


@pytest.mark.parametrize(("line", "says"), [
    ("sasl.password=x", "has a setting of its own, --sasl-password"),
    ("ssl.ca.location=/ca.pem", "--ssl-ca-location"),
    ("linger.ms=5", "not a sasl.* or ssl.* property"),
    ("sasl.oauthbearer.method", "not key=value"),
])
def test_a_properties_file_sets_only_security_properties(tmp_path: Path, line: str,
                                                         says: str) -> None:
    path = tmp_path / "kafka.properties"
    path.write_text(f"# ok\nssl.endpoint.identification.algorithm=https\n{line}\n")
    with pytest.raises(SettingsError) as refused:
        load_settings({"security_protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER"},
                      environ={"TOKENMILL_KAFKA_PROPERTIES": str(path)})
    message = str(refused.value)
    assert "TOKENMILL_KAFKA_PROPERTIES" in message and says in message and "line 3" in message
    with pytest.raises(SettingsError, match="PLAINTEXT"):
        path.write_text("ssl.key.password=x\n")
        load_settings({"kafka_properties": str(path)}, environ={})


def test_a_refusal_is_one_short_line_without_the_password() -> None:
    settings = Settings(bootstrap_servers="k1:9093", security_protocol="SASL_SSL",
                        sasl_mechanism="SCRAM-SHA-512", sasl_username="worker",
                        sasl_password=Secret("hunter2"))
    auth = KafkaError(KafkaError._AUTHENTICATION,
                      "sasl_ssl://k1:9093/bootstrap: SASL authentication error: Authentication "
                      "failed during authentication due to invalid credentials with SASL "
                      "mechanism SCRAM-SHA-512 (after 312ms in state AUTH_REQ, 4 identical "
                      "error(s) suppressed)")
    message = str(clients._refusal(settings, auth))
    assert message.startswith("Kafka at k1:9093 refused the credentials of 'worker' "
                              "(SCRAM-SHA-512): SASL authentication error:")
    assert "after 312ms" not in message and "bootstrap:" not in message
    assert "hunter2" not in message and "\n" not in message
    tls = KafkaError(KafkaError._SSL, "sasl_ssl://k1:9093/bootstrap: SSL handshake failed: "
                                      "certificate verify failed (after 9ms in state "
                                      "SSL_HANDSHAKE)")
    message = str(clients._refusal(settings, tls))
    assert "TLS handshake with Kafka at k1:9093 failed: SSL handshake failed" in message
    assert "--ssl-ca-location" in message
