"""The sink loop: the thin I/O shell around the pure pieces.

One thread owns the consumer and every transaction call (confluent-kafka
serializes consumer calls across threads anyway); uploads run in a small
pool so that decoding goes on while they are in flight.

A *round* is the oldest sealed batch of every partition that has one,
uploaded in parallel and then committed in ONE transaction (DLQ records,
counters, offsets). Only one round is in flight at a time, so a partition
never has a second upload before the first is committed: at most one
uploaded-but-uncommitted object per partition.

Rebalance callbacks run inside `consume()`, on this thread:
- revoke: wait for the round in flight and commit it (a cooperative revoke
  runs while the generation is still ours), then drop the partitions'
  batchers with their uncommitted batches; the next owner replays them from
  the committed offset;
- lost: wait for the round's uploads (they cannot be recalled), commit
  nothing, drop the batchers.
So a partition's upload has finished before the partition is released, and
a dropped batcher is gone: this instance never uploads for that partition
again unless it is assigned anew. Pinning (sink/batcher.py) and conditional
writes make a replayed object identical to whatever an earlier owner wrote.

Each loop iteration: consume up to `consume_batch` records -> route each
into its partition's batcher (probing the key of the first batch after an
assignment or rewind) -> seal batches by age -> commit the round in flight
if its uploads are done, start the next -> until-done check.
"""

from __future__ import annotations

import gc
import signal
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
from botocore.exceptions import BotoCoreError, ClientError
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from schemas import Conversation, RunSpec, SinkProgress
from schemas.progress import sink_key
from schemas.raw import capture
from sink import counters, dlq, object_keys, objects, routing, samples, store_check
from sink.batcher import Batch, PartitionBatcher
from sink.committer import Committer
from sink.config import SinkConfig
from sink.errors import InvalidRecord, ObjectConflict, S3Failed
from sink.metrics import SinkMetrics
from sink.s3_attempts import S3Errors
from sink.s3_writer import S3Writer, Uploaded, make_client
from tokenmill import progress as run_progress
from tokenmill.kafka import clients, groups, topics, transactions
from tokenmill.kafka.transactions import KafkaFatal, TransactionAborted
from tokenmill.log import get_logger
from tokenmill.settings import Settings
from tokenmill.watchdog import Watchdog

log = get_logger("tokenmill.sink")

LAG_INTERVAL_S = 5.0
ROUND_POLL_S = 0.01
SLOW_UPLOAD_S = 30.0  # an upload round this long is logged (and again as long again)


def tune_gc() -> None:
    """For a process that runs the sink: what exists at start-up lives as long
    as the process, so keep it out of the collector's way, and collect the
    young generation less often (the loop allocates a few short-lived
    containers per record, none in cycles)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


@dataclass
class Round:
    """One flush round in flight: the oldest sealed batch of some partitions,
    uploading in the pool. Committed together, in one transaction."""

    items: list[tuple[PartitionBatcher, Batch, Future[Uploaded | None]]]
    started_at: float = field(default_factory=time.time)

    def done(self) -> bool:
        return all(future.done() for _, _, future in self.items)


@dataclass
class Probe:
    """The S3 lookup for the batch a partition starts next, in the pool: the
    loop never waits on S3, so heartbeats go on while S3 hangs. Records of
    the partition are not taken until it answers; then the partition is
    read again from `offset`."""

    offset: int
    future: Future[tuple[Any, ...]]
    started_at: float = field(default_factory=time.time)


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
        self._consumer: Any = None
        self._committer: Committer | None = None
        self._s3: S3Writer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._round: Round | None = None
        self._probes: dict[int, Probe] = {}
        self._lines = samples.LineEncoder()
        self.progress = SinkProgress(run=spec.run_id, instance=config.instance)
        self.watchdog = Watchdog(f"sink {config.instance}", stall_s=config.stall_s)
        self._stranded = groups.StrandedWatch(f"{config.instance}#", grace_s=10.0)
        self._last_commit = clock()
        self._s3_errors = S3Errors()
        self._next_slow_upload_log = 0.0

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
        clients.check_broker(self.settings)
        client = self._s3_client or make_client(
            endpoint_url=self.settings.s3_endpoint_url, region=self.settings.s3_region,
            max_pool=max(10, config.upload_concurrency * 4))
        self._s3_errors.watch(client)
        self._s3 = S3Writer(client=client, bucket=config.bucket,
                            conditional_writes=config.conditional_writes)
        self._s3.ensure_bucket(create=config.create_bucket, region=self.settings.s3_region)
        store_check.check(self._s3, endpoint=self.settings.s3_endpoint_url,
                          region=self.settings.s3_region, prefix=config.prefix, run=config.run,
                          instance=config.instance, max_batch_bytes=config.limits.max_bytes)

        self.watchdog.start()
        try:
            self._serve()
        finally:
            self.watchdog.stop()
        log.info("sink stopped", s3_records=self.progress.s3_records,
                 s3_objects=self.progress.s3_objects, dlq_records=self.progress.dlq_records)
        return 0

    def _serve(self) -> None:
        config = self.config
        # Fences an earlier incarnation and aborts its open transaction, so the
        # progress value read next is final.
        txns = transactions.start(self.settings, config.transactional_id,
                                  timeout_s=config.transaction_timeout_s,
                                  watchdog=self.watchdog)
        producer = txns.producer
        run_progress.ensure_topic(self.settings, config.run)
        key = sink_key(config.run, config.instance)
        self.progress = counters.start(config.run, config.instance,
                                       run_progress.read_one(self.settings, key))
        group = topics.sink_group(config.run)
        if config.group_protocol == "consumer" and config.session_timeout_s:
            groups.set_session_timeout(clients.admin(self.settings), group,
                                       config.session_timeout_s, self.settings.connect_timeout_s)
        consumer = self._consumer = clients.consumer(
            self.settings, group, {
                **groups.member_config(config.group_protocol,
                                       client_id=f"{config.instance}#0",
                                       session_timeout_s=config.session_timeout_s),
                "enable.partition.eof": True,
                # The default 500 ms caps a read_committed backlog at a few
                # thousand 10 KB records/s; 50 ms costs 20 idle fetches/s.
                "fetch.wait.max.ms": config.fetch_wait_max_ms,
                # With 10 KB records the 64 MB prefetch queue fills in ~6,000
                # records; librdkafka then pauses fetching for up to 1 s by default.
                "fetch.queue.backoff.ms": 20,
            })
        self._committer = Committer(
            transactions=txns,
            group_metadata=consumer.consumer_group_metadata,
            source_topic=self.topic, dlq_topic=self.dlq_topic,
            progress_topic=topics.progress_topic(config.run), progress_key=key)
        log.info("sink started", run=config.run, instance=config.instance, bucket=config.bucket,
                 prefix=config.prefix, compression=config.compression,
                 batch_size=config.limits.max_records, max_batch_bytes=config.limits.max_bytes,
                 max_batch_age_s=config.limits.max_age_s, s3_records=self.progress.s3_records,
                 dlq_records=self.progress.dlq_records, group_protocol=config.group_protocol)
        self._pool = ThreadPoolExecutor(max_workers=config.upload_concurrency,
                                        thread_name_prefix="sink-upload")
        metrics_server = None
        failure: BaseException | None = None
        try:
            if config.metrics_port:
                metrics_server = self.metrics.serve(config.metrics_port)
            consumer.subscribe([self.topic], on_assign=self._on_assign,
                               on_revoke=self._on_revoke, on_lost=self._on_lost)
            self._loop()
            self._heartbeat(final=True)  # `status`: stopped, not dead
        except BaseException as exc:
            failure = exc
            if isinstance(exc, S3Failed):
                self._record_failure(exc)
            raise
        finally:
            if not isinstance(failure, KafkaFatal):  # crash-only: nothing to close then
                self._close(consumer, producer, failure is not None)
            if metrics_server is not None:
                metrics_server.shutdown()

    def _close(self, consumer: Any, producer: Any, failed: bool) -> None:
        """Leave the group (SIGTERM: at once, so the partitions move now) and
        flush. Never raises: a second error must not hide the first."""
        assert self._pool is not None
        try:
            self._pool.shutdown(wait=True)
            if failed:
                # A round still here is abandoned, not committed by the revoke
                # that close() runs: the next owner replays it.
                self._round = None
            with self.watchdog.guard("closing the consumer", 60):
                consumer.close()
            if not failed:
                with self.watchdog.guard("flushing the producer", 30):
                    producer.flush(5)
        except Exception as exc:  # noqa: BLE001 - logged; the first error is what counts
            log.warning("closing the sink's clients", error=str(exc))

    # -- rebalance callbacks (run inside consume(), on this thread) ------------

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
            self._probes.pop(tp.partition, None)  # its answer is for the next owner to ask
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
        # The uploads in flight finish and commit first: the group generation
        # is still ours while a cooperative revoke runs.
        if self._round is not None:
            self._finish_round(commit=True, leaving={tp.partition for tp in partitions})
        self._drop(partitions, "revoked")

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        # Our generation is gone: let uploads in flight finish (they cannot be
        # recalled), commit nothing, and never touch these partitions again.
        if self._round is not None:
            self._finish_round(commit=False, leaving={tp.partition for tp in partitions})
        self._drop(partitions, "lost")

    # -- the loop ------------------------------------------------------------

    def _loop(self) -> None:
        config = self.config
        next_done_check = 0.0
        next_lag = 0.0
        while not self._stopping:
            self.watchdog.beat()
            # While uploads are in flight, come back quickly to commit them.
            timeout = ROUND_POLL_S if self._round is not None else config.poll_timeout_s
            messages = self._consumer.consume(num_messages=config.consume_batch, timeout=timeout)
            for message in messages:
                self._handle(message)
            self._finish_probes()
            for writer in self.writers.values():
                writer.tick()
            self._advance(wait=self._buffered_bytes() > config.max_buffer_bytes)
            now = self.clock()
            if now >= next_lag:
                self._update_lag()
                self._repair_stranded()
                next_lag = now + LAG_INTERVAL_S
            if now - self._last_commit >= config.heartbeat_s:
                self._heartbeat()
            self._log_slow_s3()
            if (config.until_done and now >= next_done_check and self._round is None
                    and self._all_at_eof()):
                if self._check_done():
                    return
                next_done_check = self.clock() + config.done_check_interval_s
        # Stopping: the uploads in flight finish and commit; open batches are
        # left for the next owner to replay.
        if self._round is not None:
            self._finish_round(commit=True)

    def _handle(self, message: Any) -> None:
        error = message.error()
        partition = message.partition()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._at_eof.add(partition)
                return
            if error.fatal() or error.code() == KafkaError._FATAL:
                raise KafkaFatal(f"sink {self.config.instance}: {error.str()}")
            log.warning("consumer error", error=str(error))
            return
        writer = self.writers.get(partition)
        offset = message.offset()
        if writer is None or partition in self._probes or not writer.accepts(offset):
            return
        self._at_eof.discard(partition)
        if writer.needs_probe and writer.current is None:
            self._start_probe(partition, offset)
            return
        self.metrics.records_in.inc()
        raw = message.value()
        try:
            record = self._decode(raw)
        except InvalidRecord as exc:
            # Not a completion of this run: dead-lettered as it was read, and
            # its offset is committed with the batch, so the run goes on.
            log.warning("invalid record dead-lettered", partition=partition, offset=offset,
                        problem=str(exc))
            writer.add(offset, dead_letter=dlq.invalid_letter(
                capture(self.topic, partition, offset, message.key(), raw),
                run=self.config.run, detail=str(exc)))
            return
        route = routing.dlq_reason(record, self.spec)
        if route is None and isinstance(record, Conversation):
            writer.add(offset, line=samples.encode_line(samples.conversation_sample(record)))
        elif route is None:
            assert isinstance(record, samples.CompletionView)
            writer.add(offset, line=self._lines.line(record))
        else:
            reason, detail = route
            writer.add(offset, dead_letter=dlq.dead_letter(
                record, raw or b"", reason=reason, detail=detail, topic=self.topic,
                partition=partition, offset=offset))

    def _start_probe(self, partition: int, offset: int) -> None:
        assert self._s3 is not None and self._pool is not None
        keys = object_keys.candidate_keys(self.config.prefix, self.config.run, partition, offset)
        self._probes[partition] = Probe(offset, self._pool.submit(self._probe, partition, keys))

    def _probe(self, partition: int, keys: list[str]) -> tuple[Any, ...]:
        assert self._s3 is not None
        try:
            return self._s3.probe(keys)
        except (BotoCoreError, ClientError) as exc:
            raise S3Failed(f"s3 lookup of {keys[0]} for partition {partition} failed after "
                           f"retries: {exc}") from exc

    def _finish_probes(self) -> None:
        """Hand each answered probe to its partition's batcher and read the
        partition again from the probed record."""
        for partition, probe in list(self._probes.items()):
            if not probe.future.done():
                continue
            del self._probes[partition]
            existing = probe.future.result()  # S3Failed: the sink exits, as for uploads
            writer = self.writers.get(partition)
            if writer is None:  # revoked meanwhile
                continue
            writer.set_existing(existing)
            if existing:
                log.info("batch pinned to an earlier object", partition=partition,
                         first_offset=probe.offset,
                         last_offset=max(o.last_offset for o in existing),
                         keys=[o.key for o in existing])
            writer.resume_at(probe.offset)
            self._consumer.seek(TopicPartition(self.topic, partition, probe.offset))

    def _decode(self, raw: bytes | None) -> Any:
        """The record as a completion of this run, else InvalidRecord."""
        if raw is None:
            raise InvalidRecord("null value (a tombstone) in the completions topic")
        try:
            record = samples.decode_view(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise InvalidRecord(f"not a completion record: {exc}") from None
        if record.run != self.config.run:
            raise InvalidRecord(f"a record of run {record.run!r} in the topic of run "
                                f"{self.config.run!r}")
        if record.settings_hash != self._settings_hash:
            raise InvalidRecord(
                f"made with settings {record.settings_hash}, the run's settings are "
                f"{self._settings_hash}: outputs of different settings must never mix")
        return record

    # -- flushing ------------------------------------------------------------

    def _buffered_bytes(self) -> int:
        return sum(w.pending_bytes for w in self.writers.values())

    def _advance(self, *, wait: bool = False) -> None:
        """Commit the round in flight once its uploads are done (or now, with
        `wait`), then start the next round if batches are sealed."""
        if self._round is not None and (wait or self._round.done()):
            self._finish_round(commit=True)
        if self._round is None and not self._stopping:
            self._start_round()

    def _start_round(self) -> bool:
        """Start uploading the oldest sealed batch of every partition that has
        one (at most one per partition: the previous one is committed)."""
        ready = [(w, b) for w in self.writers.values() if (b := w.ready()) is not None]
        if not ready:
            return False
        assert self._pool is not None
        self._round = Round([(w, b, self._pool.submit(self._upload, b)) for w, b in ready])
        return True

    def _finish_round(self, *, commit: bool, leaving: set[int] | None = None) -> None:
        """Wait for the round's uploads, then commit them in one transaction
        (or, with `commit` False, forget them). `leaving`: partitions being
        revoked or lost, dropped right after, so never rewound."""
        current, self._round = self._round, None
        assert current is not None
        leaving = leaving or set()
        done: list[tuple[PartitionBatcher, Batch, Uploaded | None]] = []
        conflicted: list[PartitionBatcher] = []
        failure: BaseException | None = None
        for writer, batch, future in current.items:
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
        for writer in conflicted:
            self._rewind(writer, leaving)
        if not done:
            return
        if not commit:
            for writer, _, _ in done:
                self._rewind(writer, leaving)
            return
        # One transaction: DLQ records, counters, offsets.
        uploaded = [u for _, _, u in done if u is not None]
        batches = [b for _, b, _ in done]
        by_reason = counters.merge_reasons(b.dlq_by_reason() for b in batches)
        s3_records = sum(b.line_count for b in batches)
        s3_bytes = sum(u.size for u in uploaded)
        now = time.time()
        updated = msgspec.structs.replace(counters.plus(
            self.progress, s3_records=s3_records, s3_objects=len(uploaded), s3_bytes=s3_bytes,
            dlq_by_reason=by_reason, last_object=uploaded[-1].key if uploaded else "",
            now=now), last_upload_at=now, **self._liveness(uploading=False))
        assert self._committer is not None
        started = time.perf_counter()
        try:
            self._committer.commit(batches, updated)
        except TransactionAborted:
            self.metrics.aborts.inc()
            for writer, _, _ in done:
                self._rewind(writer, leaving)
            return
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        self._last_commit = self.clock()
        # Committed: forget the batches, count them.
        self.progress = updated
        for writer, batch, _ in done:
            writer.committed(batch)
            self.metrics.flushes.labels(batch.sealed_by or "unknown").inc()
        self.metrics.s3_records.inc(s3_records)
        self.metrics.objects.inc(len(uploaded))
        self.metrics.bytes.inc(s3_bytes)
        for reason, count in by_reason.items():
            self.metrics.dlq_records.labels(reason).inc(count)
        for _, batch, up in done:
            log.info("batch committed", partition=batch.partition,
                     first_offset=batch.first_offset, last_offset=batch.last_offset,
                     trigger=batch.sealed_by, s3_records=batch.line_count,
                     dlq_records=len(batch.dead_letters), key=up.key if up else None,
                     bytes=up.size if up else 0)

    def _upload(self, batch: Batch) -> Uploaded | None:
        """Write the batch's object (None for a batch of DLQ records only)."""
        try:
            return self._write_object(batch)
        except (BotoCoreError, ClientError) as exc:
            raise S3Failed(f"s3 write for partition {batch.partition} at offset "
                           f"{batch.first_offset} failed after retries: {exc}") from exc

    def _write_object(self, batch: Batch) -> Uploaded | None:
        assert self._s3 is not None
        config = self.config
        key = object_keys.object_key(config.prefix, config.run, batch.partition,
                                     batch.first_offset, config.compression)
        same = next((o for o in batch.existing if o.key == key), None)
        if batch.line_count:
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

    def _rewind(self, writer: PartitionBatcher, leaving: set[int]) -> None:
        offset = writer.rewind()
        self._probes.pop(writer.partition, None)  # asked again from the rewound offset
        self._at_eof.discard(writer.partition)
        if offset is not None and writer.partition not in leaving:
            self._consumer.seek(TopicPartition(self.topic, writer.partition, offset))
            log.info("partition rewound to its last committed batch", partition=writer.partition,
                     offset=offset)

    # -- until done ----------------------------------------------------------

    def _all_at_eof(self) -> bool:
        return all(p in self._at_eof for p in self.writers)

    def _check_done(self) -> bool:
        """True when every prompt of the run is persisted (by all instances).
        When nothing more can arrive, seal the open batches now instead of
        waiting for their age."""
        try:
            state = run_progress.try_read_run_progress(self.settings, self.config.run)
        except run_progress.ProgressUnavailable as exc:
            log.warning("run progress unavailable; checking again later", error=str(exc))
            return False
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
                # The loop uploads and commits them, round by round: never
                # wait here (a stalled S3 must not stop heartbeats).
                self._advance()
        return False

    def _heartbeat(self, *, final: bool = False) -> None:
        """Commit the counters alone (no offsets): the instance is alive, and
        what it is doing (`final`: it stopped cleanly)."""
        assert self._committer is not None
        self._last_commit = self.clock()
        now = time.time()
        beat = msgspec.structs.replace(counters.plus(self.progress, now=now),
                                       stopped_at=now if final else 0.0, **self._liveness())
        try:
            self._committer.commit([], beat)
        except TransactionAborted:
            return
        self.progress = beat

    def _liveness(self, uploading: bool = True) -> dict[str, Any]:
        """The fields `status` judges this instance's health by."""
        errors = self._s3_errors
        return {
            "heartbeat_s": self.config.heartbeat_s,
            "partitions": len(self.writers),
            "uploading_since": self._s3_busy_since() if uploading else 0.0,
            "waiting_records": sum(w.pending_records for w in self.writers.values()),
            "upload_errors": errors.count,
            "last_error": errors.last or self.progress.last_error,
            "last_error_at": errors.last_at or self.progress.last_error_at,
        }

    def _s3_busy_since(self) -> float:
        """Start of the oldest S3 call in flight (upload round or probe), 0: none."""
        started = [p.started_at for p in self._probes.values()]
        if self._round is not None:
            started.append(self._round.started_at)
        return min(started, default=0.0)

    def _log_slow_s3(self) -> None:
        since = self._s3_busy_since()
        now = time.time()
        if since and now - since >= SLOW_UPLOAD_S and now >= self._next_slow_upload_log:
            self._next_slow_upload_log = now + SLOW_UPLOAD_S
            uploading = {b.partition for _, b, _ in self._round.items} if self._round else set()
            log.warning("S3 calls still in flight", seconds=round(now - since),
                        uploading=sorted(uploading), probing=sorted(self._probes),
                        failed_attempts=self._s3_errors.count,
                        last_error=self._s3_errors.last or None)

    def _record_failure(self, exc: BaseException) -> None:
        """S3 gave up: say so in the progress record before exiting, so
        `status` shows why this sink is gone. Best effort."""
        self._s3_errors.note(str(exc))
        try:
            self._heartbeat()
        except Exception as error:  # noqa: BLE001 - the S3 failure is what counts
            log.debug("recording the S3 failure", error=str(error))

    def _repair_stranded(self) -> None:
        """Classic protocol: partitions owned by no member of a stable group
        are taken back by one member rejoining (tokenmill/kafka/groups.py)."""
        if self.config.group_protocol != "classic":
            return
        try:
            state = groups.describe(clients.admin(self.settings),
                                    topics.sink_group(self.config.run), self.topic, 5.0)
        except KafkaException as exc:
            log.debug("group description unavailable", error=str(exc))
            return
        if self._stranded.check(state, self.spec.partitions):
            self._consumer.unsubscribe()
            self._consumer.subscribe([self.topic], on_assign=self._on_assign,
                                     on_revoke=self._on_revoke, on_lost=self._on_lost)

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
