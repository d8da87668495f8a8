"""The sink loop: the thin I/O shell around the pure pieces.

One thread owns the consumer, the S3 uploads of a flush and the transactions
(confluent-kafka serializes consumer calls across threads anyway). Rebalance
callbacks run inside `consume()`, so they never run during a flush: a
partition's upload has finished (and been committed, or its transaction
aborted) before the partition can be revoked or lost. On revoke and on loss
the partition's batcher is dropped without uploading or committing; the
next owner replays from the committed offset, and pinning (sink/batcher.py)
plus conditional writes keep its first object identical to anything an
earlier owner uploaded. A dropped batcher is gone, so this instance never
uploads for that partition again unless it is assigned anew.

Each loop iteration: consume up to `consume_batch` records -> route each
into its partition's batcher (probing the key of the first batch after an
assignment) -> seal batches by age -> flush rounds (upload the oldest sealed
batch of every partition, in parallel; then one transaction for the round)
-> until-done check.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
from confluent_kafka import KafkaError, TopicPartition

from schemas import Completion, RunSpec, SinkProgress, decode_completion
from schemas.progress import sink_key
from sink import counters, dlq, object_keys, objects, routing, samples
from sink.batcher import Batch, PartitionBatcher
from sink.committer import Committer
from sink.config import SinkConfig
from sink.errors import CommitAborted, InvalidRecord, ObjectConflict
from sink.metrics import SinkMetrics
from sink.s3_writer import S3Writer, Uploaded, make_client
from tokenmill import kafka_clients, topics
from tokenmill import progress as run_progress
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.sink")

CRASH_EXIT_CODE = 137
LAG_INTERVAL_S = 5.0


class SinkService:
    """Parameters: `settings`, `spec` (the run), `config` (`SinkConfig`),
    `metrics` (a `SinkMetrics`; a private one by default), `clock`
    (monotonic seconds), `s3_client` (a boto3 client; made from settings by
    default)."""

    def __init__(self, *, settings: Settings, spec: RunSpec, config: SinkConfig,
                 metrics: SinkMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 s3_client: Any = None) -> None:
        self.settings = settings
        self.spec = spec
        self.config = config
        self.metrics = metrics or SinkMetrics()
        self.clock = clock
        self.topic = topics.completions_topic(spec.run_id)
        self.dlq_topic = topics.dlq_topic(spec.run_id)
        self._settings_hash = spec.settings_hash
        self._s3_client = s3_client
        self.writers: dict[int, PartitionBatcher] = {}
        self._at_eof: set[int] = set()
        self._stopping = False
        self._uploads = 0
        self._consumer: Any = None
        self._committer: Committer | None = None
        self._s3: S3Writer | None = None
        self.progress = SinkProgress(run=spec.run_id, instance=config.instance)

    # -- lifecycle -----------------------------------------------------------

    def stop(self, *_args: object) -> None:
        """Finish the flush in progress, then exit (SIGTERM/SIGINT)."""
        if not self._stopping:
            log.info("stopping: finishing the flush in progress")
        self._stopping = True

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def run(self) -> int:
        """Run until stopped, or until the run is persisted with `until_done`.
        Returns the exit code."""
        config = self.config
        kafka_clients.check_broker(self.settings)
        client = self._s3_client or make_client(
            endpoint_url=self.settings.s3_endpoint_url, region=self.settings.s3_region,
            max_pool=max(10, config.upload_concurrency * 4))
        self._s3 = S3Writer(client=client, bucket=config.bucket,
                            conditional_writes=config.conditional_writes)
        self._s3.ensure_bucket(create=config.create_bucket, region=self.settings.s3_region)
        metrics_server = self.metrics.serve(config.metrics_port) if config.metrics_port else None

        producer = kafka_clients.transactional_producer(self.settings, config.transactional_id)
        # Fences an earlier incarnation and aborts its open transaction, so the
        # progress value read next is final.
        producer.init_transactions(max(30.0, self.settings.connect_timeout_s))
        run_progress.ensure_topic(self.settings)
        key = sink_key(config.run, config.instance)
        self.progress = counters.start(config.run, config.instance,
                                       run_progress.read_one(self.settings, key))
        consumer = self._consumer = kafka_clients.consumer(
            self.settings, topics.sink_group(config.run), {
                "partition.assignment.strategy": "cooperative-sticky",
                "group.instance.id": config.instance,
                "session.timeout.ms": int(config.session_timeout_s * 1000),
                "heartbeat.interval.ms": max(100, int(config.session_timeout_s * 1000 / 10)),
                "enable.partition.eof": True,
            })
        self._committer = Committer(
            producer=producer, group_metadata=consumer.consumer_group_metadata,
            source_topic=self.topic, dlq_topic=self.dlq_topic,
            progress_topic=topics.PROGRESS_TOPIC, progress_key=key)
        log.info("sink started", run=config.run, instance=config.instance, bucket=config.bucket,
                 prefix=config.prefix, compression=config.compression,
                 batch_size=config.limits.max_records, max_batch_bytes=config.limits.max_bytes,
                 max_batch_age_s=config.limits.max_age_s, s3_records=self.progress.s3_records,
                 dlq_records=self.progress.dlq_records)
        consumer.subscribe([self.topic], on_assign=self._on_assign,
                           on_revoke=self._on_revoke, on_lost=self._on_lost)
        pool = ThreadPoolExecutor(max_workers=config.upload_concurrency,
                                  thread_name_prefix="sink-upload")
        try:
            self._loop(pool)
        finally:
            pool.shutdown(wait=True)
            consumer.close()
            producer.flush(5)
            if metrics_server is not None:
                metrics_server.shutdown()
        log.info("sink stopped", s3_records=self.progress.s3_records,
                 s3_objects=self.progress.s3_objects, dlq_records=self.progress.dlq_records)
        return 0

    # -- rebalance callbacks (run inside consume(), never during a flush) -----

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.writers[tp.partition] = PartitionBatcher(tp.partition, self.config.limits,
                                                          self.clock)
            self._at_eof.discard(tp.partition)
        self.metrics.assigned.set(len(self.writers))
        log.info("partitions assigned", partitions=sorted(tp.partition for tp in partitions),
                 owned=sorted(self.writers))

    def _drop(self, partitions: list[TopicPartition], why: str) -> None:
        for tp in partitions:
            writer = self.writers.pop(tp.partition, None)
            self._at_eof.discard(tp.partition)
            try:
                self.metrics.lag.remove(str(tp.partition))
            except KeyError:
                pass
            if writer is not None and not writer.idle:
                log.info(f"partition {why}: uncommitted batches dropped, the next owner replays",
                         partition=tp.partition, records=writer.pending_records)
        self.metrics.assigned.set(len(self.writers))
        log.info(f"partitions {why}", partitions=sorted(tp.partition for tp in partitions),
                 owned=sorted(self.writers))

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._drop(partitions, "revoked")

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._drop(partitions, "lost")

    # -- the loop ------------------------------------------------------------

    def _loop(self, pool: ThreadPoolExecutor) -> None:
        config = self.config
        next_done_check = 0.0
        next_lag = 0.0
        while not self._stopping:
            messages = self._consumer.consume(num_messages=config.consume_batch,
                                              timeout=config.poll_timeout_s)
            for message in messages:
                self._handle(message)
            for writer in self.writers.values():
                writer.tick()
            self._flush_ready(pool)
            now = self.clock()
            if now >= next_lag:
                self._update_lag()
                next_lag = now + LAG_INTERVAL_S
            if config.until_done and now >= next_done_check and (
                    not messages or self._all_at_eof()):
                if self._check_done(pool):
                    return
                next_done_check = self.clock() + config.done_check_interval_s

    def _handle(self, message: Any) -> None:
        error = message.error()
        partition = message.partition()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._at_eof.add(partition)
                return
            if error.fatal():
                raise RuntimeError(f"consumer error: {error}")
            log.warning("consumer error", error=str(error))
            return
        writer = self.writers.get(partition)
        offset = message.offset()
        if writer is None or not writer.accepts(offset):
            return
        self._at_eof.discard(partition)
        self.metrics.records_in.inc()
        if writer.needs_probe and writer.current is None:
            assert self._s3 is not None
            existing = self._s3.probe(object_keys.candidate_keys(
                self.config.prefix, self.config.run, partition, offset))
            writer.set_existing(existing)
            if existing:
                log.info("batch pinned to an earlier object", partition=partition,
                         first_offset=offset, last_offset=max(o.last_offset for o in existing),
                         keys=[o.key for o in existing])
        raw = message.value()
        record = self._decode(raw, partition, offset)
        route = routing.dlq_reason(record, self.spec)
        if route is None:
            assert isinstance(record, Completion)
            writer.add(offset, line=samples.sample_line(record))
        else:
            reason, detail = route
            writer.add(offset, dead_letter=dlq.dead_letter(
                record, raw, reason=reason, detail=detail, topic=self.topic,
                partition=partition, offset=offset))

    def _decode(self, raw: bytes | None, partition: int, offset: int) -> Any:
        def invalid(message: str) -> InvalidRecord:
            return InvalidRecord(message, topic=self.topic, partition=partition, offset=offset)

        if raw is None:
            raise invalid("empty record (tombstone) in the completions topic")
        try:
            record = decode_completion(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise invalid(f"undecodable completion record: {exc}") from None
        if record.run != self.config.run:
            raise invalid(f"record of run {record.run!r} in the topic of run {self.config.run!r}")
        if record.settings_hash != self._settings_hash:
            raise invalid(
                f"record made with settings {record.settings_hash}, the run's settings are "
                f"{self._settings_hash}: outputs of different settings must never mix")
        return record

    # -- flushing ------------------------------------------------------------

    def _flush_ready(self, pool: ThreadPoolExecutor) -> None:
        """Flush rounds until no partition has a sealed batch: each round
        uploads at most one batch per partition, then commits them together."""
        while True:
            ready = [(w, b) for w in self.writers.values() if (b := w.ready()) is not None]
            if not ready:
                return
            self._flush(ready, pool)
            if self._stopping:
                return

    def _flush(self, ready: list[tuple[PartitionBatcher, Batch]], pool: ThreadPoolExecutor) -> None:
        # 1. Upload every batch of the round (in parallel; this thread waits,
        #    so no rebalance callback can run meanwhile).
        futures = [(w, b, pool.submit(self._upload, b)) for w, b in ready]
        done: list[tuple[PartitionBatcher, Batch, Uploaded | None]] = []
        conflicted: list[PartitionBatcher] = []
        failure: BaseException | None = None
        for writer, batch, future in futures:
            try:
                done.append((writer, batch, future.result()))
            except ObjectConflict as exc:
                log.warning("another writer owns this key: replaying the batch pinned to it",
                            key=exc.key, partition=batch.partition)
                self.metrics.conflicts.inc()
                conflicted.append(writer)
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others
                failure = failure or exc
        if failure is not None:
            raise failure
        self._fault_point(sum(1 for _, _, u in done if u is not None))
        for writer in conflicted:
            self._rewind(writer)
        if not done:
            return
        # 2. One transaction: DLQ records, counters, offsets.
        uploaded = [u for _, _, u in done if u is not None]
        batches = [b for _, b, _ in done]
        by_reason = counters.merge_reasons(b.dlq_by_reason() for b in batches)
        s3_records = sum(len(b.lines) for b in batches)
        updated = counters.plus(
            self.progress, s3_records=s3_records, s3_objects=len(uploaded),
            s3_bytes=sum(u.size for u in uploaded), dlq_by_reason=by_reason,
            last_object=uploaded[-1].key if uploaded else "", now=time.time())
        assert self._committer is not None
        started = time.perf_counter()
        try:
            self._committer.commit(batches, updated)
        except CommitAborted:
            self.metrics.aborts.inc()
            for writer, _, _ in done:
                if self.writers.get(writer.partition) is writer:
                    self._rewind(writer)
            return
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        # 3. Committed: forget the batches, count them.
        self.progress = updated
        for writer, batch, _ in done:
            writer.committed(batch)
            self.metrics.flushes.labels(batch.sealed_by or "unknown").inc()
        self.metrics.s3_records.inc(s3_records)
        self.metrics.objects.inc(len(uploaded))
        self.metrics.bytes.inc(sum(u.size for u in uploaded))
        for reason, count in by_reason.items():
            self.metrics.dlq_records.labels(reason).inc(count)
        for _, batch, up in done:
            log.info("batch committed", partition=batch.partition,
                     first_offset=batch.first_offset, last_offset=batch.last_offset,
                     trigger=batch.sealed_by, s3_records=len(batch.lines),
                     dlq_records=len(batch.dead_letters), key=up.key if up else None,
                     bytes=up.size if up else 0)

    def _upload(self, batch: Batch) -> Uploaded | None:
        """Write the batch's object (None for a batch of DLQ records only)."""
        assert self._s3 is not None
        config = self.config
        key = object_keys.object_key(config.prefix, config.run, batch.partition,
                                     batch.first_offset, config.compression)
        same = next((o for o in batch.existing if o.key == key), None)
        if batch.lines:
            data = objects.body(batch.lines, config.compression)
            started = time.perf_counter()
            uploaded = self._s3.upload(
                key, data, objects.metadata(batch, run=config.run, topic=self.topic,
                                            settings_hash=self._settings_hash),
                content_type="application/zstd" if config.compression == "zstd"
                else "application/x-ndjson",
                if_match=same.etag if same else None)
            self.metrics.upload_seconds.observe(time.perf_counter() - started)
        else:
            uploaded = None
        # Objects an earlier owner wrote for this range under another name
        # (other compression), or that now has no lines: they must go.
        for obj in batch.existing:
            if uploaded is None or obj.key != key:
                self._s3.delete(obj.key)
        return uploaded

    def _fault_point(self, uploaded: int) -> None:
        limit = self.config.exit_after_upload
        if limit is None or not uploaded:
            return
        self._uploads += uploaded
        if self._uploads >= limit:
            log.warning("fault injection: exiting after upload, before commit",
                        uploads=self._uploads)
            os._exit(CRASH_EXIT_CODE)

    def _rewind(self, writer: PartitionBatcher) -> None:
        offset = writer.rewind()
        if offset is not None:
            self._consumer.seek(TopicPartition(self.topic, writer.partition, offset))
            log.info("partition rewound to its last committed batch", partition=writer.partition,
                     offset=offset)

    # -- until done ----------------------------------------------------------

    def _all_at_eof(self) -> bool:
        return all(p in self._at_eof for p in self.writers)

    def _check_done(self, pool: ThreadPoolExecutor) -> bool:
        """True when every prompt of the run is persisted (by all instances).
        When nothing more can arrive, seal the open batches now instead of
        waiting for their age."""
        state = run_progress.read_run_progress(self.settings, self.config.run)
        if state.sink_done:
            log.info("run persisted", published=state.published, persisted=state.persisted)
            return True
        if not state.publishing_done or not self._all_at_eof():
            return False
        pending = sum(w.pending_records for w in self.writers.values())
        if state.generation_done or state.persisted + pending >= state.published:
            drained = [w.partition for w in self.writers.values() if w.drain()]
            if drained:
                log.info("nothing more to come: flushing open batches", partitions=drained)
                self._flush_ready(pool)
        return False

    def _update_lag(self) -> None:
        if not self.writers:
            return
        try:
            positions = self._consumer.position(
                [TopicPartition(self.topic, p) for p in self.writers])
            for tp in positions:
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    self.metrics.lag.labels(str(tp.partition)).set(max(0, high - tp.offset))
        except Exception as exc:  # noqa: BLE001 - metrics must never stop the sink
            log.debug("lag update failed", error=str(exc))
