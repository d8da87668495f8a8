"""The partitions this instance owns, each with its batcher.

One `PartitionBatcher` per assigned partition (Kafka Connect's
TopicPartitionWriter): created on assign, dropped on revoke or loss, and
with it the partition's probe and end-of-partition mark. A dropped batcher
is gone: nothing of it is ever uploaded, unless the partition is assigned
anew (and then it is read again from the committed offset).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sink.batcher import BatchLimits, PartitionBatcher
from sink.metrics import SinkMetrics
from sink.probes import Probes
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink")


class Ownership:
    """Parameters: `limits`, `clock` (the batchers'), `metrics`, `probes`
    (the partitions' S3 probes), `seek` (read a partition again from an
    offset)."""

    def __init__(self, *, limits: BatchLimits, clock: Callable[[], float],
                 metrics: SinkMetrics, probes: Probes,
                 seek: Callable[[int, int], None]) -> None:
        self._limits = limits
        self._clock = clock
        self._metrics = metrics
        self._probes = probes
        self._seek = seek
        self.batchers: dict[int, PartitionBatcher] = {}
        self._at_end: set[int] = set()

    # -- assignment ------------------------------------------------------------

    def assign(self, partitions: Iterable[int]) -> None:
        partitions = list(partitions)
        for partition in partitions:
            self.batchers[partition] = PartitionBatcher(partition, self._limits, self._clock)
            self._at_end.discard(partition)
        self._metrics.assigned.set(len(self.batchers))
        log.info("partitions assigned", partitions=sorted(partitions), owned=sorted(self.batchers))

    def drop(self, partitions: Iterable[int], why: str) -> None:
        """Forget the partitions (`why`: revoked or lost) with their
        uncommitted batches: the next owner replays them."""
        partitions = list(partitions)
        for partition in partitions:
            batcher = self.batchers.pop(partition, None)
            self._probes.forget(partition)  # its answer is for the next owner to ask
            self._at_end.discard(partition)
            try:
                self._metrics.lag.remove(str(partition))
            except KeyError:
                pass
            if batcher is not None and not batcher.idle:
                log.info(f"partition {why}: uncommitted batches dropped, the next owner replays",
                         partition=partition, records=batcher.pending_records)
        self._metrics.assigned.set(len(self.batchers))
        log.info(f"partitions {why}", partitions=sorted(partitions), owned=sorted(self.batchers))

    def rewind(self, batcher: PartitionBatcher, *, leaving: bool) -> None:
        """Forget the partition's uncommitted batches and read it again from
        the oldest one; a `leaving` partition is dropped next, so not read."""
        offset = batcher.rewind()
        self._probes.forget(batcher.partition)  # asked again from the rewound offset
        self._at_end.discard(batcher.partition)
        if offset is not None and not leaving:
            self._seek(batcher.partition, offset)
            log.info("partition rewound to its last committed batch", partition=batcher.partition,
                     offset=offset)

    # -- reading ---------------------------------------------------------------

    def reached_end(self, partition: int) -> None:
        self._at_end.add(partition)

    def reading(self, partition: int) -> None:
        """A record of the partition was read: it is not at its end."""
        self._at_end.discard(partition)

    def all_at_end(self) -> bool:
        return all(p in self._at_end for p in self.batchers)

    def tick(self) -> None:
        """Seal the batches that are old enough."""
        for batcher in self.batchers.values():
            batcher.tick()

    def drain(self) -> list[int]:
        """Seal every open batch now (nothing more will come); the partitions
        whose batch was sealed."""
        return [b.partition for b in self.batchers.values() if b.drain()]

    @property
    def pending_records(self) -> int:
        return sum(b.pending_records for b in self.batchers.values())

    @property
    def pending_bytes(self) -> int:
        return sum(b.pending_bytes for b in self.batchers.values())
