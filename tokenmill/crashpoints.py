"""Named moments where a crash does the most harm (a transaction's records on
the broker but not committed, a shard written but not recorded), reported by
the services as they pass them.

Nothing happens unless a test entry point installed an observer
(tests/faults.py kills the process at a chosen point), so the services carry
no fault switch and no test-only environment variable: one mechanism for
every crash test.
"""

from __future__ import annotations

from collections.abc import Callable


class Observer:
    def reached(self, point: str, count: int, flush: Callable[[], object] | None) -> None:
        """`count`: how many times this process reached `point`, this one
        included; `flush` pushes what is buffered (e.g. produced records) out."""


_observer: Observer | None = None


def install(observer: Observer) -> None:
    global _observer
    _observer = observer


def reached(point: str, count: int, flush: Callable[[], object] | None = None) -> None:
    if _observer is not None:
        _observer.reached(point, count, flush)
