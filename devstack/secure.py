"""The secured local broker (`tokenmill dev up --secure`): SASL_SSL with
SCRAM-SHA-512, TLS from a CA made here, the StandardAuthorizer on, and one
principal per tokenmill role.

Everything lives in `<state_dir>/secure/` (mode 0700): the CA (`ca.pem`,
what clients trust), the broker's key and certificate chain (`broker.pem`,
PEM keystore, mode 0600) and the passwords (`credentials.json`, mode 0600),
made once and kept, so a restarted stack is the same stack.

Principals: `broker` (the broker's own, inter-broker and controller
traffic: the only super user), `admin` (may create and list ACLs: ALTER
and DESCRIBE on the cluster, nothing else; what `tokenmill deploy acls
--apply` runs as), and the roles `producer`, `worker`, `sink`, `reader`,
which start with no ACL at all: `tokenmill deploy acls --run RUN --apply`
grants a run's. SCRAM credentials are written into the storage when it is
formatted (`StorageTool format --add-scram`), so they exist before the
broker first starts.

Listeners: clients and brokers on SASL_SSL (SCRAM-SHA-512); the controller
listener on SASL_SSL too, with PLAIN for the `broker` principal (JAAS
configured: SCRAM credentials live in the metadata log, which a controller
must reach before it can read them).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from devstack.kafka_broker import BrokerSetupError
from tokenmill.kafka import kraft

MECHANISM = "SCRAM-SHA-512"
BROKER_PRINCIPAL = "broker"
ADMIN = "admin"
ROLES = ("producer", "worker", "sink", "reader")
PRINCIPALS = (BROKER_PRINCIPAL, ADMIN, *ROLES)
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
CERT_DAYS = 825


class SecureState(msgspec.Struct):
    """What a secured stack's clients need, kept in stack.json (no secret:
    the passwords stay in `credentials`, mode 0600)."""

    directory: str
    ca_location: str
    credentials: str
    mechanism: str = MECHANISM


def secure_dir(state_dir: Path) -> Path:
    return state_dir / "secure"


def _write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner can read, never readable on the way."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def prepare(state_dir: Path, hosts: Sequence[str], data_dirs: Sequence[Path] = ()) -> SecureState:
    """The CA, the broker's certificate (valid for `hosts`, `localhost` and
    127.0.0.1) and the passwords: made on first use, then reused. Brokers
    whose storage (`data_dirs`) was formatted without them cannot be
    secured: their principals would have no credentials."""
    directory = secure_dir(state_dir)
    if not (directory / "credentials.json").is_file():
        formatted = [str(d) for d in data_dirs if (d / "meta.properties").is_file()]
        if formatted:
            raise BrokerSetupError(
                f"{', '.join(formatted)} holds a broker formatted without --secure; "
                f"`tokenmill dev down` and remove it, or use another --state-dir")
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_path, broker_path = directory / "ca.pem", directory / "broker.pem"
    if not (ca_path.is_file() and broker_path.is_file()):
        ca_pem, broker_pem = make_certificates(hosts)
        _write_private(broker_path, broker_pem)
        ca_path.write_bytes(ca_pem)
    credentials = directory / "credentials.json"
    if not credentials.is_file():
        passwords = {name: secrets.token_urlsafe(24) for name in PRINCIPALS}
        _write_private(credentials, json.dumps(passwords, indent=2).encode())
    return SecureState(directory=str(directory), ca_location=str(ca_path),
                       credentials=str(credentials))


def make_certificates(hosts: Sequence[str]) -> tuple[bytes, bytes]:
    """(the CA's certificate, the broker's PEM keystore: its PKCS#8 key,
    its certificate and the CA's), both PEM. EC P-256 keys, SHA-256."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tokenmill dev CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName("localhost"),
                                     x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for host in dict.fromkeys(hosts):
        try:
            address = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            names.append(x509.DNSName(host))
        else:
            if address not in names:
                names.append(address)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tokenmill kafka")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem)
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ca_pem, key_pem + cert.public_bytes(pem) + ca_pem


def passwords(security: SecureState) -> dict[str, str]:
    loaded: dict[str, str] = json.loads(Path(security.credentials).read_text())
    return loaded


def password(security: SecureState, principal: str) -> str:
    try:
        return passwords(security)[principal]
    except KeyError:
        raise KeyError(f"no principal {principal!r} in {security.credentials}; "
                       f"there are {', '.join(PRINCIPALS)}") from None


def _jaas(module: str, username: str, secret: str, **users: str) -> str:
    extra = "".join(f' user_{name}="{value}"' for name, value in users.items())
    return f'{module} required username="{username}" password="{secret}"{extra};'


def broker_overrides(security: SecureState, node: kraft.Node,
                     listen_host: str | None = None) -> dict[str, str]:
    """The server.properties keys that make `node` a secured broker."""
    listen = listen_host or node.host
    secret = password(security, BROKER_PRINCIPAL)
    directory = Path(security.directory)
    return {
        "listeners": f"SASL_SSL://{listen}:{node.kafka_port},"
                     f"CONTROLLER://{listen}:{node.controller_port}",
        "advertised.listeners": f"SASL_SSL://{node.host}:{node.kafka_port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": _jaas(
            "org.apache.kafka.common.security.scram.ScramLoginModule",
            BROKER_PRINCIPAL, secret),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas(
            "org.apache.kafka.common.security.plain.PlainLoginModule",
            BROKER_PRINCIPAL, secret, **{BROKER_PRINCIPAL: secret}),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(directory / "broker.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": security.ca_location,
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{BROKER_PRINCIPAL}",
        "allow.everyone.if.no.acl.found": "false",
    }


def with_overrides(properties: str, overrides: Mapping[str, str]) -> str:
    """`properties` with each overridden key's line dropped and the
    overrides appended (one key, one value: no duplicates to guess from)."""
    kept = [line for line in properties.splitlines()
            if line.lstrip().startswith("#") or line.partition("=")[0].strip() not in overrides]
    block = ["", "# Secured by `tokenmill dev up --secure` (devstack/secure.py)."]
    return "\n".join([*kept, *block, *(f"{k}={v}" for k, v in overrides.items())]) + "\n"


def format_args(security: SecureState) -> list[str]:
    """`StorageTool format` arguments that create every principal's SCRAM
    credentials in the new storage."""
    args = []
    for name, secret in passwords(security).items():
        args += ["--add-scram", f"{MECHANISM}=[name={name},password={secret}]"]
    return args


def client_config(security: SecureState, principal: str) -> dict[str, Any]:
    """librdkafka settings of a client that logs in as `principal`."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": security.mechanism,
            "sasl.username": principal, "sasl.password": password(security, principal),
            "ssl.ca.location": security.ca_location}


def shared_env(security: SecureState) -> dict[str, str]:
    """TOKENMILL_* variables every role shares."""
    return {"TOKENMILL_SECURITY_PROTOCOL": "SASL_SSL",
            "TOKENMILL_SASL_MECHANISM": security.mechanism,
            "TOKENMILL_SSL_CA_LOCATION": security.ca_location}


def role_env(security: SecureState, principal: str) -> dict[str, str]:
    """The variables that log a tokenmill command in as `principal`."""
    return {"TOKENMILL_SASL_USERNAME": principal,
            "TOKENMILL_SASL_PASSWORD": password(security, principal)}


def grant_admin(security: SecureState, bootstrap: str, timeout_s: float = 30.0) -> None:
    """Let `admin` create and list ACLs (ALTER and DESCRIBE on the cluster);
    done by the broker's own principal, the only super user. Idempotent."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _Silent(),
                              **client_config(security, BROKER_PRINCIPAL)}
    client = AdminClient(config)
    wanted = [AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                         f"User:{ADMIN}", "*", operation, AclPermissionType.ALLOW)
              for operation in (AclOperation.ALTER, AclOperation.DESCRIBE)]
    for future in client.create_acls(wanted, request_timeout=timeout_s).values():
        future.result()


class _Silent:
    def log(self, *args: Any) -> None:
        pass


def broker_setup(security: SecureState | None) -> dict[str, Any]:
    """`kafka_broker.prepare`'s keyword arguments for a secured stack (none
    for a plain one)."""
    if security is None:
        return {}

    def configure(plan: Any, properties: str) -> str:
        return with_overrides(properties, broker_overrides(security, plan.node))

    return {"configure": configure, "format_args": format_args(security)}


def admin_config(security: SecureState | None) -> dict[str, Any] | None:
    """What the stack's own checks log in with (None: a plain stack)."""
    return None if security is None else client_config(security, ADMIN)
