"""One typed settings object for every command.

Each setting comes from its CLI flag, else its `TOKENMILL_*` environment
variable, else its default. A malformed value is refused with an error that
names the flag or variable it came from. Secrets are `Secret`, which never
prints its value.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

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
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_bucket: str | None = None
    s3_prefix: str = ""
    state_dir: Path = msgspec.field(default_factory=lambda: Path(".tokenmill").absolute())
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: LogFormat = "auto"
    connect_timeout_s: float = 10.0

    def redacted(self) -> dict[str, Any]:
        """Settings as a plain dict for logging, with secrets masked."""
        out: dict[str, Any] = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            out[name] = "***" if isinstance(value, Secret) else str(value) if isinstance(value, Path) else value
        return out


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
    Option("security_protocol", "Kafka security protocol: PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL."),
    Option("sasl_mechanism", "SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER."),
    Option("sasl_username", "SASL username."),
    Option("sasl_password", "SASL password (prefer the environment variable).", secret=True),
    Option("ssl_ca_location", "CA certificate file for TLS."),
    Option("ssl_certificate_location", "Client certificate file for mutual TLS."),
    Option("ssl_key_location", "Client key file for mutual TLS."),
    Option("s3_endpoint_url", "S3 endpoint URL (unset: AWS S3)."),
    Option("s3_region", "S3 region."),
    Option("s3_bucket", "S3 bucket for completions."),
    Option("s3_prefix", "Key prefix inside the bucket."),
    Option("state_dir", "Local state directory (dev stack, spool, rejects)."),
    Option("log_level", "Log level: debug, info, warning, error."),
    Option("log_format", "Log format: auto (JSON unless a terminal), json, console."),
    Option("connect_timeout_s", "Seconds to wait for Kafka before giving up."),
)


def _convert(option: Option, raw: Any, source: str) -> Any:
    if option.secret:
        return Secret(str(raw))
    if option.name == "state_dir":
        return Path(str(raw)).expanduser().absolute()
    try:
        # Build a one-field Settings to reuse msgspec's typed conversion.
        converted = msgspec.convert({option.name: raw}, Settings, strict=False)
    except msgspec.ValidationError as exc:
        detail = str(exc).split(" - at ")[0]
        raise SettingsError(f"invalid value {raw!r} for {source}: {detail}") from None
    return getattr(converted, option.name)


def load_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Flags win over environment variables, which win over defaults."""
    flags = flags or {}
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw = flags.get(option.name)
        if raw is not None:
            values[option.name] = _convert(option, raw, option.flag)
        elif option.env in environ and environ[option.env] != "":
            values[option.name] = _convert(option, environ[option.env], option.env)
    settings = Settings(**values)
    _check_consistency(settings)
    return settings


def _check_consistency(settings: Settings) -> None:
    if settings.security_protocol.startswith("SASL") and not settings.sasl_mechanism:
        raise SettingsError(
            f"--security-protocol {settings.security_protocol} needs --sasl-mechanism "
            f"(or {ENV_PREFIX}SASL_MECHANISM)"
        )
    if settings.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
        settings.sasl_username and settings.sasl_password
    ):
        raise SettingsError(
            f"--sasl-mechanism {settings.sasl_mechanism} needs --sasl-username and a password "
            f"({ENV_PREFIX}SASL_PASSWORD)"
        )
    for part in settings.bootstrap_servers.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SettingsError(
                f"invalid value {settings.bootstrap_servers!r} for --bootstrap-servers / "
                f"{ENV_PREFIX}BOOTSTRAP_SERVERS: expected host:port[,host:port]"
            )


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
