"""What a flush transaction holds (the protocol itself is the shared one,
tokenmill/kafka/transactions.py): for every batch of the round its DLQ records,
this instance's cumulative `SinkProgress` record, and the input offsets (the
offset after each batch's last record, never a count), sent with a fresh
`consumer_group_metadata()` so a sink that lost its partitions is fenced by
the group coordinator (KIP-447).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import TopicPartition

from schemas import SinkProgress, encode_record
from sink.batcher import Batch
from tokenmill.kafka.transactions import GroupOffsets, Transactions


class Committer:
    """Parameters: `transactions` (the sink's producer), `group_metadata`
    (the consumer's, fresh at send time), `source_topic`, `dlq_topic`,
    `progress_topic`, `progress_key`."""

    def __init__(self, *, transactions: Transactions, group_metadata: Callable[[], Any],
                 source_topic: str, dlq_topic: str, progress_topic: str,
                 progress_key: str) -> None:
        self._transactions = transactions
        self._group_metadata = group_metadata
        self._source_topic = source_topic
        self._dlq_topic = dlq_topic
        self._progress_topic = progress_topic
        self._progress_key = progress_key.encode()

    def commit(self, batches: Sequence[Batch], progress: SinkProgress) -> None:
        """Commit the batches (already uploaded) and the counters. Raises
        TransactionAborted (nothing committed: replay the batches) or
        KafkaFatal (the sink must exit)."""
        offsets = [TopicPartition(self._source_topic, b.partition, b.next_offset)
                   for b in batches]
        with self._transactions.transaction(
                lambda: [GroupOffsets(offsets, self._group_metadata)]) as txn:
            for batch in batches:
                for letter in batch.dead_letters:
                    txn.produce(self._dlq_topic, letter.value, key=letter.key,
                                headers=letter.headers)
            txn.produce(self._progress_topic, encode_record(progress), key=self._progress_key)
