"""What the worker's next transaction holds (pure: tested without a broker).

Requests finish out of order, so a partition's committable results are the
contiguous finished prefix of its watermark (consumer/watermark.py), and its
safe next offset is the one after them. A checkpoint holds, for each
partition it covers, those results and that offset, groups the offsets by
the slot that holds the partition (each slot sends its own, with its own
group metadata: KIP-447), and the progress record after them (the counters
of consumer/counters.py and a snapshot of the worker). Results stay in the
watermarks until the transaction committed: `settle()` takes them then, and
only then moves the committed offsets, so an aborted transaction leaves
everything for the next one.

`commit()` is the transaction itself (tokenmill/kafka/transactions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from consumer import counters
from consumer.partitions import Output, PartitionState
from consumer.recent_rate import RecentRate
from schemas.completion import encode_record
from schemas.progress import ConsumerProgress, ServerSnapshot
from tokenmill.kafka.transactions import GroupOffsets, Transactions

Key = tuple[str, int]  # (input topic, partition)


class Vitals(msgspec.Struct, frozen=True):
    """What the progress record tells `status` about the worker at the commit,
    besides its counters."""

    concurrency_limit: int = 0
    in_flight: int = 0
    breaker: str = ""  # the failure cause while the circuit breaker is open
    server: ServerSnapshot | None = None
    partitions: int = 0


@dataclass(frozen=True)
class Batch:
    """One partition's part: its ready results and the offset after them."""

    state: PartitionState
    records: tuple[Output, ...]
    next_offset: int


def ready_batches(states: Iterable[PartitionState], max_records: int) -> list[Batch]:
    """The ready results of each partition that has some (at most
    `max_records` each), without taking them."""
    batches = []
    for state in states:
        records, next_offset = state.watermark.peek_ready(max_records)
        if records and next_offset is not None:
            batches.append(Batch(state, tuple(records), next_offset))
    return batches


@dataclass(frozen=True)
class Checkpoint:
    batches: tuple[Batch, ...]
    progress: ConsumerProgress  # the counters once these records are committed
    at: float  # wall-clock seconds the counters were taken at
    totals: tuple[int, int]  # (requests, completion tokens) after it: the recent rates' sample

    @classmethod
    def of(cls, batches: Sequence[Batch], *, progress: ConsumerProgress, recent: RecentRate,
           vitals: Vitals, heartbeat_s: float, final: bool, now: float) -> Checkpoint:
        """The checkpoint of `batches` over the last committed `progress`.
        `final`: the last commit of a clean exit (marks the worker stopped)."""
        records = [r for b in batches for r in b.records]
        counted = counters.add_records(progress, records, sum(b.state.retries for b in batches),
                                       now=now)
        totals = (counted.completions + counted.failures, counted.completion_tokens)
        rates = recent.rates(now, *totals)
        new_progress = msgspec.structs.replace(
            counted, concurrency_limit=vitals.concurrency_limit, in_flight=vitals.in_flight,
            breaker=vitals.breaker, server=vitals.server, heartbeat_s=heartbeat_s,
            last_work_at=now if records else counted.last_work_at,
            stopped_at=now if final else 0.0, partitions=vitals.partitions,
            recent_requests_per_s=rates.requests_per_s, recent_tokens_per_s=rates.tokens_per_s,
            recent_window_s=rates.window_s)
        return cls(tuple(batches), new_progress, now, totals)

    @property
    def records(self) -> list[Output]:
        return [r for b in self.batches for r in b.records]

    def offsets(self) -> dict[str, dict[Key, int]]:
        """Next input offsets by the slot holding each partition."""
        by_slot: dict[str, dict[Key, int]] = {}
        for batch in self.batches:
            by_slot.setdefault(batch.state.slot, {})[batch.state.key] = batch.next_offset
        return by_slot

    def settle(self) -> None:
        """The transaction committed: take its results from the watermarks
        and move the committed offsets."""
        for batch in self.batches:
            batch.state.watermark.take(len(batch.records))
            batch.state.retries = 0
            batch.state.committed = batch.next_offset


GroupOffsetsOf = Callable[[Mapping[str, Mapping[Key, int]]], Sequence[GroupOffsets]]


def commit(checkpoint: Checkpoint, transactions: Transactions, *, group_offsets: GroupOffsetsOf,
           topic_of: Callable[[Output], str], progress_topic: str, progress_key: str) -> None:
    """One transaction: every record to its topic (in the partition of its
    input), the progress record, then each slot's offsets with that slot's
    fresh group metadata (`group_offsets`). Raises TransactionAborted
    (nothing of it is visible) or KafkaFatal; settles nothing."""
    offsets = checkpoint.offsets()
    with transactions.transaction(lambda: group_offsets(offsets)) as txn:
        for batch in checkpoint.batches:
            for record in batch.records:
                txn.produce(topic_of(record), encode_record(record), key=record.id.encode(),
                            partition=batch.state.partition)
        txn.produce(progress_topic, msgspec.json.encode(checkpoint.progress),
                    key=progress_key.encode())
