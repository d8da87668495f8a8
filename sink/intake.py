"""What one message read from `<run>.completions` becomes: an end-of-partition
mark, a consumer error, or the next record of its partition's open batch,
decoded, checked against the run and routed (sink/routing.py): a JSONL
line for S3 or a DLQ record. Records of this run are untrusted too: one
that cannot belong to it goes to the DLQ with reason `invalid`, bytes as
read, and the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka import KafkaError

from schemas import Conversation, Failure, RunSpec
from schemas.raw import capture
from sink import dlq, routing, samples
from sink.batcher import PartitionBatcher
from sink.errors import InvalidRecord
from sink.metrics import SinkMetrics
from sink.ownership import Ownership
from sink.probes import Probes
from sink.samples import CompletionView
from tokenmill.kafka import clients
from tokenmill.kafka.fetch_stall import Silence
from tokenmill.kafka.transactions import KafkaFatal
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink")


class Intake:
    """Parameters: `spec` (the run: its QA policy and settings hash), `run`
    and `instance` (the sink's), `topic` (the completions topic),
    `ownership`, `probes`, `metrics`, `silence` (told what was heard of
    each partition), `clock` (monotonic seconds)."""

    def __init__(self, *, spec: RunSpec, run: str, instance: str, topic: str,
                 ownership: Ownership, probes: Probes, metrics: SinkMetrics,
                 silence: Silence[int], clock: Callable[[], float]) -> None:
        self._spec = spec
        self._run = run
        self._settings_hash = spec.settings_hash
        self._instance = instance
        self._topic = topic
        self._ownership = ownership
        self._probes = probes
        self._metrics = metrics
        self._silence = silence
        self._clock = clock
        self._lines = samples.LineEncoder()

    def take(self, message: Any) -> None:
        """One message from `consume()`. Raises KafkaFatal for a fatal error."""
        error = message.error()
        partition = message.partition()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._ownership.reached_end(partition)
                self._silence.end(partition, message.offset(), self._clock())
                return
            if error.fatal() or error.code() == KafkaError._FATAL or clients.refused_by_acl(error):
                raise KafkaFatal(f"sink {self._instance}: {error.str()}")
            log.warning("consumer error", error=str(error))
            return
        batcher = self._ownership.batchers.get(partition)
        offset = message.offset()
        self._silence.record(partition, offset, self._clock())
        if batcher is None or partition in self._probes or not batcher.accepts(offset):
            return
        self._ownership.reading(partition)
        if batcher.needs_probe and batcher.current is None:
            self._probes.start(partition, offset)
            return
        self._metrics.records_in.inc()
        self._add(batcher, partition, offset, message.key(), message.value())

    def _add(self, batcher: PartitionBatcher, partition: int, offset: int, key: bytes | None,
             raw: bytes | None) -> None:
        try:
            record = self.decode(raw)
        except InvalidRecord as exc:
            # Dead-lettered as it was read; its offset is committed with the batch.
            log.warning("invalid record dead-lettered", partition=partition, offset=offset,
                        problem=str(exc))
            batcher.add(offset, dead_letter=dlq.invalid_letter(
                capture(self._topic, partition, offset, key, raw),
                run=self._run, detail=str(exc)))
            return
        route = routing.dlq_reason(record, self._spec)
        if route is None and isinstance(record, Conversation):
            batcher.add(offset, line=samples.encode_line(samples.conversation_sample(record)))
        elif route is None:
            assert isinstance(record, CompletionView)
            batcher.add(offset, line=self._lines.line(record))
        else:
            reason, detail = route
            batcher.add(offset, dead_letter=dlq.dead_letter(
                record, raw or b"", reason=reason, detail=detail, topic=self._topic,
                partition=partition, offset=offset))

    def decode(self, raw: bytes | None) -> CompletionView | Failure | Conversation:
        """The record as a completion of this run, else InvalidRecord."""
        if raw is None:
            raise InvalidRecord("null value (a tombstone) in the completions topic")
        try:
            record = samples.decode_view(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidRecord(f"not a completion record: {exc}") from None
        if record.run != self._run:
            raise InvalidRecord(f"a record of run {record.run!r} in the topic of run "
                                f"{self._run!r}")
        if record.settings_hash != self._settings_hash:
            raise InvalidRecord(
                f"made with settings {record.settings_hash}, the run's settings are "
                f"{self._settings_hash}: outputs of different settings must never mix")
        return record
