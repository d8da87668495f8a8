"""One commit of the generation worker, as numbered steps over the
transactional producer: results of the ready prefixes, the instance's
counters, the input offsets (KIP-447), commit. Aborts on every early exit.

Kept apart from the worker loop so the sequence reads top to bottom and the
loop only decides what is ready and what to do when a commit fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from confluent_kafka import KafkaException, Producer, TopicPartition

from schemas.completion import CompletionRecord, encode_record
from schemas.progress import ConsumerProgress
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")

COMMIT_ATTEMPTS = 5


class CommitAborted(Exception):
    """The transaction was aborted; nothing of it is visible. Retry later."""


class CommitFatal(Exception):
    """The producer is fenced or broken; the worker must stop."""


@dataclass(frozen=True)
class PartitionCommit:
    partition: int
    records: Sequence[CompletionRecord]
    next_offset: int  # the input offset to commit: last record's offset + 1


class TransactionalCommitter:
    def __init__(self, *, producer: Producer, prompts_topic: str, completions_topic: str,
                 progress_topic: str, progress_key: str,
                 group_metadata: Callable[[], Any], timeout_s: float = 30.0) -> None:
        self._producer = producer
        self._prompts_topic = prompts_topic
        self._completions_topic = completions_topic
        self._progress_topic = progress_topic
        self._progress_key = progress_key.encode()
        self._group_metadata = group_metadata
        self._timeout_s = timeout_s

    def commit(self, parts: Sequence[PartitionCommit], progress: ConsumerProgress) -> None:
        producer = self._producer
        # 1. Open the transaction: only now, never across an LLM call.
        producer.begin_transaction()
        try:
            # 2. Each partition's results, into the same partition of .completions.
            for part in parts:
                for record in part.records:
                    self._produce(self._completions_topic, record.id.encode(),
                                  encode_record(record), part.partition)
            # 3. The instance's cumulative counters.
            self._produce(self._progress_topic, self._progress_key,
                          msgspec.json.encode(progress), None)
            # 4. The input offsets, with fresh group metadata (fences zombies).
            offsets = [TopicPartition(self._prompts_topic, p.partition, p.next_offset)
                       for p in parts]
            producer.send_offsets_to_transaction(offsets, self._group_metadata(),
                                                 self._timeout_s)
            # 5. Commit; a retriable failure leaves the outcome open: retry it.
            self._commit()
        except KafkaException as exc:
            self._abort(exc)

    def _produce(self, topic: str, key: bytes, value: bytes, partition: int | None) -> None:
        while True:
            try:
                if partition is None:
                    self._producer.produce(topic, key=key, value=value)
                else:
                    self._producer.produce(topic, key=key, value=value, partition=partition)
                return
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.05)

    def _commit(self) -> None:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self._producer.commit_transaction(self._timeout_s * 2)
                return
            except KafkaException as exc:
                if exc.args[0].retriable() and attempt < COMMIT_ATTEMPTS:
                    log.warning("commit retry", error=str(exc.args[0]))
                    continue
                raise

    def _abort(self, exc: KafkaException) -> None:
        error = exc.args[0]
        if error.fatal():
            raise CommitFatal(str(error)) from None
        try:
            self._producer.abort_transaction(self._timeout_s)
        except KafkaException as abort_exc:
            raise CommitFatal(f"could not abort the transaction: {abort_exc}") from None
        raise CommitAborted(str(error)) from None
