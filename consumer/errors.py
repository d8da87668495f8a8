"""The consumer's errors."""

from __future__ import annotations


class FatalWorkerError(RuntimeError):
    """The worker cannot go on (fenced, misconfigured server)."""
