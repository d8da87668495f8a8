"""Per-partition offset watermark: which results may be committed.

Requests finish out of order, but a partition's committed offset says "every
record before this is done". So only the contiguous prefix of finished
offsets is committable; results above a gap wait here. Offsets are taken
from the records actually fetched (never counted: transaction markers take
offset slots), so the committed offset is the last finished offset + 1.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class OffsetOrderError(ValueError):
    """An offset arrived that is not above every offset seen before."""


class Watermark(Generic[T]):
    __slots__ = ("_pending", "_results", "_last_taken")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()  # fetched offsets, ascending, not yet taken
        self._results: dict[int, T] = {}  # finished, not yet taken
        self._last_taken: int | None = None

    def track(self, offset: int) -> None:
        """A fetched record; offsets must only go up."""
        last = self._pending[-1] if self._pending else self._last_taken
        if last is not None and offset <= last:
            raise OffsetOrderError(f"offset {offset} is not above {last}")
        self._pending.append(offset)

    def finish(self, offset: int, result: T) -> None:
        if offset in self._results:
            raise ValueError(f"offset {offset} finished twice")
        self._results[offset] = result

    def ready_count(self) -> int:
        n = 0
        for offset in self._pending:
            if offset not in self._results:
                break
            n += 1
        return n

    def peek_ready(self, limit: int | None = None) -> tuple[list[T], int | None]:
        """Results of the finished prefix (in offset order) and the offset to
        commit after them, without taking them: a commit may still fail."""
        results: list[T] = []
        commit: int | None = None
        for offset in self._pending:
            if offset not in self._results or (limit is not None and len(results) >= limit):
                break
            results.append(self._results[offset])
            commit = offset + 1
        return results, commit

    def take(self, count: int) -> None:
        """Forget the first `count` ready results once their commit succeeded."""
        for _ in range(count):
            offset = self._pending.popleft()
            del self._results[offset]
            self._last_taken = offset

    @property
    def in_flight(self) -> int:
        """Tracked records not finished yet."""
        return len(self._pending) - len(self._results)

    @property
    def waiting(self) -> int:
        """Finished results held back by a gap below them."""
        return len(self._results) - self.ready_count()

    @property
    def tracked(self) -> int:
        return len(self._pending)
