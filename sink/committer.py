"""The flush transaction: what makes uploaded batches committed.

One Kafka transaction per flush round holds, for every batch of the round:
its DLQ records, this instance's cumulative `SinkProgress` record, and the
input offsets (the offset after each batch's last record, never a count),
sent with a fresh `consumer_group_metadata()` so a sink that lost its
partitions is fenced by the group coordinator (KIP-447).

The steps are numbered; every early exit aborts the transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from schemas import SinkProgress, encode_record
from sink.batcher import Batch
from sink.errors import CommitAborted
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink.commit")


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


class Committer:
    """Parameters: `producer` (transactional, initialized), `group_metadata`
    (returns the consumer's current group metadata), `source_topic`,
    `dlq_topic`, `progress_topic`, `progress_key`, `timeout_s`."""

    def __init__(self, *, producer: Any, group_metadata: Callable[[], Any], source_topic: str,
                 dlq_topic: str, progress_topic: str, progress_key: str,
                 timeout_s: float = 60.0) -> None:
        self._producer = producer
        self._group_metadata = group_metadata
        self._source_topic = source_topic
        self._dlq_topic = dlq_topic
        self._progress_topic = progress_topic
        self._progress_key = progress_key.encode()
        self._timeout_s = timeout_s

    def commit(self, batches: Sequence[Batch], progress: SinkProgress) -> None:
        """Commit the batches (already uploaded) and the progress counters.
        Raises CommitAborted if the transaction had to be aborted: nothing
        of it is committed and the batches must be replayed."""
        producer = self._producer
        # 1. Open the transaction (only now: never across an upload).
        producer.begin_transaction()
        try:
            # 2. The batches' dead letters.
            for batch in batches:
                for letter in batch.dead_letters:
                    self._produce(self._dlq_topic, letter.key, letter.value, letter.headers)
            # 3. The counters, cumulative for this instance.
            self._produce(self._progress_topic, self._progress_key, encode_record(progress), None)
            # 4. The input offsets: after each batch's last record.
            offsets = [TopicPartition(self._source_topic, b.partition, b.next_offset)
                       for b in batches]
            self._retrying(lambda: producer.send_offsets_to_transaction(
                offsets, self._group_metadata(), self._timeout_s))
            # 5. Commit (flushes the produced records first).
            self._retrying(lambda: producer.commit_transaction(self._timeout_s))
        except KafkaException as exc:
            error = _kafka_error(exc)
            if error is not None and error.txn_requires_abort():
                log.warning("flush transaction aborted", error=str(error),
                            partitions=sorted(b.partition for b in batches))
                producer.abort_transaction(self._timeout_s)
                raise CommitAborted(str(error)) from None
            raise
        except BaseException:
            # Anything else (a bug, KeyboardInterrupt): do not leave it open.
            try:
                producer.abort_transaction(self._timeout_s)
            except KafkaException as exc:
                log.warning("abort after failure failed", error=str(exc))
            raise

    def _produce(self, topic: str, key: bytes, value: bytes,
                 headers: list[tuple[str, bytes]] | None) -> None:
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers)
                return
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.05)

    @staticmethod
    def _retrying(call: Callable[[], Any], attempts: int = 5) -> None:
        for attempt in range(1, attempts + 1):
            try:
                call()
                return
            except KafkaException as exc:
                error = _kafka_error(exc)
                if error is None or not error.retriable() or attempt == attempts:
                    raise
                log.info("retrying transaction step", error=str(error), attempt=attempt)
                time.sleep(min(0.1 * 2 ** attempt, 2.0))
