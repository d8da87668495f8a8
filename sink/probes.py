"""The S3 probe of the batch a partition starts next (see sink/batcher.py on
pinning): which objects an earlier owner wrote at its key.

The lookup runs in the upload pool and the loop never waits on it, so
heartbeats go on while S3 hangs. Records of a partition being probed are
not taken; once the probe answers, the answer goes to the partition's
batcher and the partition is read again from the probed record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from sink.batcher import ExistingObject, PartitionBatcher
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink")

Lookup = Callable[[int, int], "Future[tuple[ExistingObject, ...]]"]


@dataclass
class Probe:
    """One lookup in flight: for the batch of `partition` starting at `offset`."""

    offset: int
    future: Future[tuple[ExistingObject, ...]]
    started_at: float = field(default_factory=time.time)


class Probes:
    """Parameters: `lookup` (starts the lookup for a partition and a first
    offset; a future of the objects found), `seek` (read a partition again
    from an offset)."""

    def __init__(self, *, lookup: Lookup, seek: Callable[[int, int], None]) -> None:
        self._lookup = lookup
        self._seek = seek
        self._pending: dict[int, Probe] = {}

    def __contains__(self, partition: int) -> bool:
        return partition in self._pending

    @property
    def partitions(self) -> list[int]:
        return sorted(self._pending)

    def start(self, partition: int, offset: int) -> None:
        self._pending[partition] = Probe(offset, self._lookup(partition, offset))

    def forget(self, partition: int) -> None:
        """The partition left or was rewound: its answer, if it ever comes,
        is for whoever asks again."""
        self._pending.pop(partition, None)

    def busy_since(self) -> float:
        """Wall time the oldest lookup in flight started; 0: none."""
        return min((p.started_at for p in self._pending.values()), default=0.0)

    def finish(self, batchers: Mapping[int, PartitionBatcher]) -> None:
        """Hand each answered probe to its partition's batcher and read the
        partition again from the probed record. A failed lookup (S3Failed)
        raises: the sink exits, as for uploads."""
        for partition, probe in list(self._pending.items()):
            if not probe.future.done():
                continue
            del self._pending[partition]
            existing = probe.future.result()
            batcher = batchers.get(partition)
            if batcher is None:  # revoked meanwhile
                continue
            batcher.set_existing(existing)
            if existing:
                log.info("batch pinned to an earlier object", partition=partition,
                         first_offset=probe.offset,
                         last_offset=max(o.last_offset for o in existing),
                         keys=[o.key for o in existing])
            batcher.resume_at(probe.offset)
            self._seek(partition, probe.offset)
