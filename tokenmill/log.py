"""structlog set-up: JSON for services under systemd, readable on a terminal.

Only the CLI calls `configure`; library code just asks for a logger.
Values of keys that look like secrets are masked before rendering, so a
password can never reach a log line even when passed by mistake.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

SECRET_MARKERS = ("password", "secret", "token_value", "sasl", "credential", "aws_secret")
MASK = "***"

LogFormat = Literal["auto", "json", "console"]


def mask_secrets(_logger: Any, _method: str,
                 event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if any(marker in key.lower() for marker in SECRET_MARKERS):
            event[key] = MASK
    return event


def configure(level: str = "info", fmt: LogFormat = "auto", stream: Any = None) -> None:
    stream = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    numeric = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            mask_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)
