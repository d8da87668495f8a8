"""One typed settings object for every command.

Each setting comes from its CLI flag, else its `TOKENMILL_*` environment
variable, else its default. A malformed value is refused with an error that
names the flag or variable it came from. Secrets are `Secret`, which never
prints its value.
"""

from __future__ import annotations

import math
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlparse

import click
import msgspec

ENV_PREFIX = "TOKENMILL_"


class SettingsError(click.UsageError):
    """A setting has a value that cannot be used; the message names its source."""


class Secret:
    """A string that never shows itself in logs, reprs or tracebacks."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def sglang_api_key() -> Secret | None:
    """The SGLang server's API key (`--api-key` of the server), from
    TOKENMILL_SGLANG_API_KEY: kept out of flags so it never shows in `ps`."""
    value = os.environ.get("TOKENMILL_SGLANG_API_KEY")
    return Secret(value) if value else None


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
LogFormat = Literal["auto", "json", "console"]


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    kafka_properties: str | None = None  # a file of librdkafka sasl.*/ssl.* properties
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_bucket: str | None = None
    s3_prefix: str = ""
    state_dir: Path = msgspec.field(default_factory=lambda: Path(".tokenmill").absolute())
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: LogFormat = "auto"
    connect_timeout_s: float = 10.0
    startup_timeout_s: float = 120.0
    # field -> the flag or variable its value came from (absent: the default)
    sources: dict[str, str] = msgspec.field(default_factory=dict)

    def redacted(self) -> dict[str, Any]:
        """Settings as a plain dict for logging, with secrets masked."""
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            if name == "sources":
                continue
            value = getattr(self, name)
            if isinstance(value, Secret):
                value = "***"
            elif isinstance(value, Path):
                value = str(value)
            out[name] = value
        return out

    def source(self, name: str) -> str:
        """Where a setting's value came from, for error messages."""
        option = OPTION_BY_NAME[name]
        return self.sources.get(name) or f"{option.flag} / {option.env}"


@dataclass(frozen=True)
class Option:
    name: str  # field of Settings
    help: str
    secret: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


OPTIONS: tuple[Option, ...] = (
    Option("bootstrap_servers", "Kafka bootstrap servers, host:port[,host:port]."),
    Option("security_protocol",
           "Kafka security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL."),
    Option("sasl_mechanism", "SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER."),
    Option("sasl_username", "SASL username."),
    Option("sasl_password", "SASL password (prefer the environment variable).", secret=True),
    Option("ssl_ca_location", "CA certificate file for TLS."),
    Option("ssl_certificate_location", "Client certificate file for mutual TLS."),
    Option("ssl_key_location", "Client key file for mutual TLS."),
    Option("kafka_properties", "File of librdkafka sasl.* and ssl.* properties for every Kafka "
                               "client (OAUTHBEARER/OIDC, a client key's password, ...)."),
    Option("s3_endpoint_url", "S3 endpoint URL, http(s)://host[:port] (unset: AWS S3)."),
    Option("s3_region", "S3 region."),
    Option("s3_bucket", "S3 bucket for completions."),
    Option("s3_prefix", "Key prefix inside the bucket."),
    Option("state_dir", "Local state directory (dev stack, spool, rejects)."),
    Option("log_level", "Log level: debug, info, warning, error."),
    Option("log_format", "Log format: auto (JSON unless a terminal), json, console."),
    Option("connect_timeout_s", "Seconds one attempt to reach Kafka may take (0 < s <= 3600)."),
    Option("startup_timeout_s", "Seconds a service waits at start for Kafka, S3 or its SGLang "
                                "server to come up (0: do not wait)."),
)
OPTION_BY_NAME = {option.name: option for option in OPTIONS}


# --- checks of single values: None when fine, else what is wrong ------------


def seconds_problem(value: float, *, minimum: float, maximum: float,
                    min_open: bool = False) -> str | None:
    """A finite number of seconds within [minimum, maximum] (or (minimum, ...])."""
    if not math.isfinite(value):
        return "expected a finite number of seconds"
    if value < minimum or (min_open and value == minimum) or value > maximum:
        low = f"> {minimum:g}" if min_open else f">= {minimum:g}"
        return f"expected a number of seconds {low} and <= {maximum:g}"
    return None


def http_url_problem(url: str) -> str | None:
    """An http(s) URL with a host and, if given, a valid port."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "expected an http(s) URL with a host (e.g. http://127.0.0.1:9000)"
    try:
        parsed.port  # noqa: B018 - raises on a malformed or out-of-range port
    except ValueError:
        return "the URL has a malformed port"
    return None


def bootstrap_problem(servers: str) -> str | None:
    for part in servers.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")  # [::1]:9092
        if not sep or not host or any(c.isspace() for c in host) or not port.isdigit():
            return "expected host:port[,host:port]"
        if not 1 <= int(port) <= 65535:
            return f"port {port} is not within 1-65535"
    return None


_REGION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # us-east-1, auto, RegionOne
# Loose on purpose (S3-compatible stores and legacy buckets differ): what is
# refused here is never a bucket name, e.g. an s3:// URL or a key path.
BUCKET_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,255}$")


def region_problem(region: str) -> str | None:
    return None if _REGION.match(region) else "expected a region name like us-east-1"


def bucket_problem(bucket: str) -> str | None:
    return None if BUCKET_PATTERN.match(bucket) else (
        "expected a bucket name: letters, digits, '.', '_' or '-' (no '/', no s3:// prefix)")


def state_dir_problem(path: Path) -> str | None:
    if path.exists() and not path.is_dir():
        return "exists and is not a directory"
    return None


def file_problem(path: str) -> str | None:
    return None if Path(path).expanduser().is_file() else "no such file"


# What --kafka-properties may set: librdkafka's security properties, less the
# ones a setting of its own owns (one place for each value).
PROPERTY_PREFIXES = ("sasl.", "ssl.")
OWNED_PROPERTIES = {
    "sasl.mechanism": "--sasl-mechanism", "sasl.mechanisms": "--sasl-mechanism",
    "sasl.username": "--sasl-username", "sasl.password": "--sasl-password",
    "ssl.ca.location": "--ssl-ca-location",
    "ssl.certificate.location": "--ssl-certificate-location",
    "ssl.key.location": "--ssl-key-location",
}


class PropertiesError(ValueError):
    """A line of a properties file that tokenmill will not pass on."""


def read_properties(path: str) -> dict[str, str]:
    """`key=value` lines (blank lines and `#` or `!` comments skipped) of
    librdkafka sasl.* and ssl.* properties. The values may be secrets: they
    appear in no message."""
    found: dict[str, str] = {}
    text = Path(path).expanduser().read_text()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PropertiesError(f"line {number} is not key=value")
        if key in OWNED_PROPERTIES:
            raise PropertiesError(f"line {number}: {key} has a setting of its own, "
                                  f"{OWNED_PROPERTIES[key]}")
        if not key.startswith(PROPERTY_PREFIXES):
            raise PropertiesError(f"line {number}: {key} is not a sasl.* or ssl.* property")
        found[key] = value.strip()
    return found


def properties_problem(path: str) -> str | None:
    try:
        read_properties(path)
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read it ({exc})"
    except PropertiesError as exc:
        return str(exc)
    return None


VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "bootstrap_servers": bootstrap_problem,
    "ssl_ca_location": file_problem,
    "ssl_certificate_location": file_problem,
    "ssl_key_location": file_problem,
    "kafka_properties": lambda path: file_problem(path) or properties_problem(path),
    "s3_endpoint_url": http_url_problem,
    "s3_region": region_problem,
    "s3_bucket": bucket_problem,
    "state_dir": state_dir_problem,
    "connect_timeout_s": lambda v: seconds_problem(v, minimum=0, maximum=3600, min_open=True),
    "startup_timeout_s": lambda v: seconds_problem(v, minimum=0, maximum=7 * 86400),
}
# Spelled either way by users; librdkafka and logging do not care.
_UPPER = {"security_protocol", "sasl_mechanism"}
_LOWER = {"log_level", "log_format"}


def _choices(name: str) -> tuple[str, ...]:
    hint = typing.get_type_hints(Settings)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:
        args = list(typing.get_args(args[0]))
    return tuple(str(a) for a in args)


def _convert(option: Option, raw: Any, source: str) -> Any:
    if option.secret:
        return Secret(str(raw))
    if isinstance(raw, str):
        raw = raw.strip()
        if option.name in _UPPER:
            raw = raw.upper()
        elif option.name in _LOWER:
            raw = raw.lower()
    if option.name == "state_dir":
        value: Any = Path(str(raw)).expanduser().absolute()
    else:
        try:
            # Build a one-field Settings to reuse msgspec's typed conversion.
            converted = msgspec.convert({option.name: raw}, Settings, strict=False)
        except msgspec.ValidationError as exc:
            detail = str(exc).split(" - at ")[0]
            if "enum value" in detail:
                detail = "expected one of " + ", ".join(_choices(option.name))
            raise SettingsError(f"invalid value {raw!r} for {source}: {detail}") from None
        value = getattr(converted, option.name)
    check = VALUE_CHECKS.get(option.name)
    problem = check(value) if check is not None else None
    if problem:
        raise SettingsError(f"invalid value {str(raw)!r} for {source}: {problem}")
    return value


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Flags win over environment variables, which win over defaults."""
    flags = flags or {}
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        raw = flags.get(option.name)
        if raw is not None:
            sources[option.name] = option.flag
        elif option.env in environ and environ[option.env] != "":
            raw = environ[option.env]
            sources[option.name] = option.env
        else:
            continue
        values[option.name] = _convert(option, raw, sources[option.name])
    settings = Settings(**values, sources=sources)
    _check_consistency(settings)
    return settings


def _check_consistency(settings: Settings) -> None:
    """Combinations that cannot work, or that would silently be ignored."""
    protocol = settings.security_protocol
    if protocol.startswith("SASL") and not settings.sasl_mechanism:
        raise SettingsError(
            f"{settings.source('security_protocol')} {protocol} needs --sasl-mechanism "
            f"(or {ENV_PREFIX}SASL_MECHANISM)"
        )
    # A mechanism says SASL was meant; credentials alone may come from a
    # shared secret store and are simply unused without SASL.
    if not protocol.startswith("SASL") and settings.sasl_mechanism is not None:
        raise SettingsError(
            f"{settings.source('sasl_mechanism')} is set but the security protocol is "
            f"{protocol}: it would be ignored; use --security-protocol SASL_SSL or "
            f"SASL_PLAINTEXT ({ENV_PREFIX}SECURITY_PROTOCOL)")
    if settings.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
        settings.sasl_username and settings.sasl_password
    ):
        raise SettingsError(
            f"{settings.source('sasl_mechanism')} {settings.sasl_mechanism} needs "
            f"--sasl-username and a password ({ENV_PREFIX}SASL_PASSWORD)"
        )
    if not protocol.endswith("SSL"):
        for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
            if getattr(settings, name) is not None:
                raise SettingsError(
                    f"{settings.source(name)} is set but the security protocol is {protocol}: "
                    "it would be ignored; use --security-protocol SSL or SASL_SSL "
                    f"({ENV_PREFIX}SECURITY_PROTOCOL)")
    if protocol == "PLAINTEXT" and settings.kafka_properties is not None:
        raise SettingsError(
            f"{settings.source('kafka_properties')} is set but the security protocol is "
            f"PLAINTEXT: its sasl.* and ssl.* properties would be ignored; use "
            f"--security-protocol ({ENV_PREFIX}SECURITY_PROTOCOL)")
    if (settings.ssl_certificate_location is None) != (settings.ssl_key_location is None):
        given = ("ssl_certificate_location" if settings.ssl_key_location is None
                 else "ssl_key_location")
        raise SettingsError(f"{settings.source(given)} needs its pair: mutual TLS takes both "
                            "--ssl-certificate-location and --ssl-key-location")


def writable_state_dir(settings: Settings, *parts: str) -> Path:
    """The state directory (or a folder in it), created if missing; a usage
    error naming the setting when it cannot be created or written."""
    path = settings.state_dir.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise SettingsError(f"invalid value '{settings.state_dir}' for "
                            f"{settings.source('state_dir')}: {path} is not a directory") from None
    except OSError as exc:
        raise SettingsError(f"invalid value '{settings.state_dir}' for "
                            f"{settings.source('state_dir')}: cannot create {path}: "
                            f"{exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SettingsError(f"invalid value '{settings.state_dir}' for "
                            f"{settings.source('state_dir')}: {path} is not writable")
    return path


F = TypeVar("F", bound=Callable[..., Any])


def settings_options(func: F) -> F:
    """Add every shared setting as a CLI option; values reach the command as
    keyword arguments named after the Settings fields."""
    for option in reversed(OPTIONS):
        func = click.option(
            option.flag,
            option.name,
            default=None,
            show_envvar=False,
            help=f"{option.help} [env: {option.env}]",
        )(func)
    return func


def pop_settings(kwargs: dict[str, Any]) -> Settings:
    """Take the shared options out of a command's kwargs and build Settings."""
    flags = {option.name: kwargs.pop(option.name, None) for option in OPTIONS}
    return load_settings(flags)
