"""Kafka client construction from Settings: one place that knows the
security options, the logger hookup and the connection check.

Constructors here never touch the network; `check_broker` does, and fails
fast with the address in the message instead of hanging; `wait_for_broker`
is the services' start-up wait for a broker that is not up yet.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

# confluent-kafka re-exports its admin types without __all__ (see committed.py).
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    NewTopic,
)

from tokenmill.kafka.topics import MAX_MESSAGE_BYTES
from tokenmill.log import get_logger
from tokenmill.settings import Settings, read_properties
from tokenmill.startup import StartupWait, wait_until_up

log = get_logger("tokenmill.kafka")


class BrokerUnreachable(RuntimeError):
    """Kafka did not answer at the configured address within the timeout;
    `reason` is the short why (librdkafka's error)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# The broker's ACLs refused a call: a missing ACL, which retrying cannot fix.
ACL_REFUSALS = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED,
                          KafkaError.GROUP_AUTHORIZATION_FAILED,
                          KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                          KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})


def refused_by_acl(error: KafkaError) -> bool:
    """Whether a client error says an ACL is missing (a consumer reports a
    group it may not use as a plain error and would retry it forever)."""
    return error.code() in ACL_REFUSALS


class BrokerRefused(RuntimeError):
    """The broker answered and refused this client: wrong credentials, or a
    TLS handshake that failed (an unknown CA, a name the certificate does
    not cover). Waiting does not fix that, so nothing retries it."""


BROKER_HINT = ("is the broker running? (`tokenmill dev up` starts a local one; set "
               "--bootstrap-servers or TOKENMILL_BOOTSTRAP_SERVERS)")


class _LibrdkafkaLog:
    """Routes librdkafka's own log lines into structlog at debug level, so a
    dead broker does not spray connection errors over the terminal."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        message = fmt % args if args else fmt
        log.debug("librdkafka", level=logging.getLevelName(level), message=message)


_LOGGER = _LibrdkafkaLog()


RECONNECT_BACKOFF_MAX_MS = 1000
# librdkafka (2.16) retires the bootstrap connection once the first metadata
# names the brokers, and a request sent on it is retried on a new
# connection only after a pause of half this backoff (default 100 ms): every
# new client's first request took 55 ms on an idle local broker, 15 ms at 20.
RECONNECT_BACKOFF_MS = 20


def base_config(settings: Settings) -> dict[str, Any]:
    """librdkafka settings shared by every client; secrets revealed only here."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "security.protocol": settings.security_protocol,
        "logger": _LOGGER,
        "socket.connection.setup.timeout.ms": int(settings.connect_timeout_s * 1000),
        # librdkafka backs off reconnecting to a down broker up to 10 s (the
        # Java client: 1 s), so a restarted broker went unnoticed for up to
        # 10 s by every client, a service waiting at start-up included.
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
        "reconnect.backoff.ms": RECONNECT_BACKOFF_MS,
    }
    if settings.sasl_mechanism:
        config["sasl.mechanism"] = settings.sasl_mechanism
    if settings.sasl_username:
        config["sasl.username"] = settings.sasl_username
    if settings.sasl_password is not None:
        config["sasl.password"] = settings.sasl_password.reveal()
    for key, value in (
        ("ssl.ca.location", settings.ssl_ca_location),
        ("ssl.certificate.location", settings.ssl_certificate_location),
        ("ssl.key.location", settings.ssl_key_location),
    ):
        if value:
            config[key] = value
    if settings.kafka_properties:
        config.update(read_properties(settings.kafka_properties))
    return config


def kafka_python_config(settings: Settings) -> dict[str, Any]:
    """The same connection for kafka-python, used for independent read-only views."""
    config: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers.split(","),
        "security_protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        config["sasl_mechanism"] = settings.sasl_mechanism
        config["sasl_plain_username"] = settings.sasl_username
        if settings.sasl_password is not None:
            config["sasl_plain_password"] = settings.sasl_password.reveal()
    if settings.ssl_ca_location:
        config["ssl_cafile"] = settings.ssl_ca_location
    if settings.ssl_certificate_location:
        config["ssl_certfile"] = settings.ssl_certificate_location
    if settings.ssl_key_location:
        config["ssl_keyfile"] = settings.ssl_key_location
    return config


def producer(settings: Settings, extra: Mapping[str, Any] | None = None) -> Producer:
    config = base_config(settings)
    config.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.max.bytes": MAX_MESSAGE_BYTES,
            "compression.type": "lz4",
        }
    )
    config.update(extra or {})
    return Producer(config)


# The broker's timeout of a transaction, by default (workers' and sinks'
# --transaction-timeout). Transactions are opened only to commit, so they are
# short; a short timeout bounds how long a member killed mid-commit holds
# back read_committed readers of the partitions it wrote (its restart with
# the same transactional.id aborts at once).
TRANSACTION_TIMEOUT_S = 20.0


def transactional_producer(
    settings: Settings, transactional_id: str, extra: Mapping[str, Any] | None = None
) -> Producer:
    config = {"transactional.id": transactional_id,
              "transaction.timeout.ms": round(TRANSACTION_TIMEOUT_S * 1000)}
    config.update(extra or {})
    return producer(settings, config)


def consumer(settings: Settings, group_id: str, extra: Mapping[str, Any] | None = None) -> Consumer:
    config = base_config(settings)
    config.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
        }
    )
    config.update(extra or {})
    return Consumer(config)


def admin(settings: Settings) -> AdminClient:
    return AdminClient(base_config(settings))


# librdkafka's errors that say the broker refused us, not that it is away.
_REFUSALS = {KafkaError._AUTHENTICATION: "authentication", KafkaError._SSL: "tls"}
_CHECK_SLICE_S = 0.25  # how often a check looks at the refusals seen so far
# librdkafka prefixes the broker ("sasl_ssl://host:9092/bootstrap: ") and
# appends its state ("(after 312ms in state AUTH_REQ, 4 identical error(s)
# suppressed)"): neither helps the reader of one line.
_BROKER_PREFIX = re.compile(r"^\S+://\S+?/\S+?: ")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state .*\)\s*$")


def _refusal(settings: Settings, error: KafkaError) -> BrokerRefused:
    detail = _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", error.str()))
    where = settings.bootstrap_servers
    if _REFUSALS[error.code()] == "authentication":
        who = f"of {settings.sasl_username!r} " if settings.sasl_username else ""
        check = (f"the sasl.oauthbearer.* properties ({settings.source('kafka_properties')})"
                 if settings.sasl_mechanism == "OAUTHBEARER" else
                 f"{settings.source('sasl_username')} and the password (TOKENMILL_SASL_PASSWORD)")
        return BrokerRefused(
            f"Kafka at {where} refused the credentials {who}({settings.sasl_mechanism}): "
            f"{detail}; check {check}")
    return BrokerRefused(
        f"the TLS handshake with Kafka at {where} failed: {detail}; check "
        f"{settings.source('ssl_ca_location')} (the CA that signed the broker's certificate) "
        "and that the certificate names the host in --bootstrap-servers")


def check_broker(settings: Settings, timeout_s: float | None = None) -> str:
    """Return the cluster id; raise BrokerRefused as soon as the broker
    refuses our credentials or TLS, or BrokerUnreachable naming the address
    when nothing answers within the timeout."""
    timeout = settings.connect_timeout_s if timeout_s is None else timeout_s
    refused: list[KafkaError] = []

    def on_error(error: KafkaError) -> None:
        if error.code() in _REFUSALS:
            refused.append(error)

    config: dict[str, Any] = {**base_config(settings), "error_cb": on_error}
    client = AdminClient(config)
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            metadata = client.list_topics(timeout=max(0.01, min(_CHECK_SLICE_S, left)))
            return str(metadata.cluster_id)
        except KafkaException as exc:
            client.poll(0)  # serves error_cb
            if refused:
                raise _refusal(settings, refused[0]) from None
            if time.monotonic() < deadline:
                continue
            reason = (f"no answer within {timeout:g}s "
                      f"({exc.args[0].str() if exc.args else exc})")
            raise BrokerUnreachable(
                f"cannot reach Kafka at {settings.bootstrap_servers}: {reason}; {BROKER_HINT}",
                reason) from None


def wait_for_broker(settings: Settings) -> str:
    """`check_broker` until the broker answers, for up to the start-up
    timeout (logged while waiting); the cluster id, or DependencyDown."""
    wait = StartupWait("Kafka", settings.bootstrap_servers,
                       timeout_s=settings.startup_timeout_s, hint=BROKER_HINT)
    return wait_until_up(lambda: check_broker(settings), wait, down=(BrokerUnreachable,))


def ensure_topics(
    client: AdminClient,
    topics: Mapping[str, int],
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create missing topics (name -> partitions); return the ones created.

    An existing topic with a different partition count is an error: the
    partition count is part of a run's identity."""
    existing = client.list_topics(timeout=timeout_s).topics
    missing = []
    for name, partitions in topics.items():
        if name in existing:
            have = len(existing[name].partitions)
            if have != partitions:
                raise RuntimeError(
                    f"topic {name} exists with {have} partitions, the run needs {partitions}"
                )
        else:
            missing.append(NewTopic(name, num_partitions=partitions, replication_factor=-1,
                                    config=dict(config or {})))
    if not missing:
        return []
    futures = client.create_topics(missing, operation_timeout=timeout_s, request_timeout=timeout_s)
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args and exc.args[0].name() == "TOPIC_ALREADY_EXISTS":
                continue
            raise
    return created
