"""Failed S3 attempts as botocore sees them, retries included. botocore
retries quietly for minutes (10 attempts, 120 s read timeout each), so
without this a frozen endpoint looks like a sink with nothing to do."""

from __future__ import annotations

import time
from typing import Any


def describe_attempt(response: Any, caught_exception: BaseException | None) -> str | None:
    """What went wrong with one attempt, or None when it did not fail in a
    way worth reporting (2xx, and the 404s and 412s the sink expects)."""
    if caught_exception is not None:
        return f"{type(caught_exception).__name__}: {caught_exception}"[:300]
    try:
        status = int(response[0].status_code)
    except (TypeError, IndexError, AttributeError, ValueError):
        return None
    if status >= 500 or status == 429:
        return f"HTTP {status} from S3"
    return None


class S3Errors:
    """Counts failed attempts of one S3 client (a botocore event hook; runs
    on the upload threads, hence only plain assignments)."""

    def __init__(self) -> None:
        self.count = 0
        self.last = ""
        self.last_at = 0.0

    def watch(self, client: Any) -> None:
        events = getattr(getattr(client, "meta", None), "events", None)
        if events is not None:
            events.register("needs-retry.s3", self._on_attempt)

    def note(self, message: str) -> None:
        self.count += 1
        self.last = message
        self.last_at = time.time()

    def _on_attempt(self, response: Any = None, caught_exception: BaseException | None = None,
                    **_: Any) -> None:
        message = describe_attempt(response, caught_exception)
        if message is not None:
            self.note(message)
