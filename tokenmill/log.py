"""structlog set-up: JSON for services under systemd, readable on a terminal.

Only the CLI calls `configure`; library code just asks for a logger.
Values of keys that look like secrets are masked before rendering, so a
password can never reach a log line even when passed by mistake.

structlog is imported at a process's first log line, not before: importing
it costs about 45 ms of CPU (it brings rich's traceback rendering, pygments
and attrs along), which a short command that logs nothing, such as `status`,
paid on every look; on a machine whose cores a starting fleet keeps busy,
that is a second of waiting (docs/benchmarks.md, "status at a seed-size
launch").
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from types import ModuleType

    from structlog.typing import EventDict, WrappedLogger

SECRET_MARKERS = ("password", "secret", "token_value", "sasl", "credential", "aws_secret")
MASK = "***"

LogFormat = Literal["auto", "json", "console"]

# The last `configure` call's arguments, applied at the next log line (under
# the lock: a thread's line must not go out unconfigured, to stdout, while
# another thread applies them).
_pending: tuple[str, LogFormat, Any] | None = None
_applying = threading.Lock()


def mask_secrets(_logger: WrappedLogger, _method: str, event: EventDict) -> EventDict:
    for key in list(event):
        if any(marker in key.lower() for marker in SECRET_MARKERS):
            event[key] = MASK
    return event


def configure(level: str = "info", fmt: LogFormat = "auto", stream: Any = None) -> None:
    """Takes effect at the next log line of any logger (structlog is imported then)."""
    global _pending
    with _applying:
        _pending = (level, fmt, stream or sys.stderr)


def _structlog() -> ModuleType:
    """structlog, with the last `configure` applied."""
    global _pending
    import structlog

    if _pending is not None:
        with _applying:
            if _pending is not None:
                _apply(structlog, *_pending)
                _pending = None
    return structlog


def _apply(structlog: ModuleType, level: str, fmt: LogFormat, stream: Any) -> None:
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


class Logger:
    """A structlog logger that imports structlog when first used: every call
    (`info`, `bind`, ...) goes to `structlog.get_logger(name)` as configured
    at that moment."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, method: str) -> Any:
        return getattr(_structlog().get_logger(self.name), method)


def get_logger(name: str) -> Any:
    return Logger(name)
