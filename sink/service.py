"""The sink loop: it wires the jobs and owns none of their state.

One thread owns the consumer and every transaction call (confluent-kafka
serializes consumer calls across threads anyway); S3 calls run in a small
pool (sink/object_store.py) so that decoding goes on while they are in
flight. The jobs:
- sink/ownership.py: the partitions owned, one batcher each;
- sink/probes.py: the S3 probe of the batch a partition starts next;
- sink/intake.py: each message read, into its partition's batcher;
- sink/round.py: the round in flight, what its ONE transaction commits
  (DLQ records, counters, offsets), and what happens to leaving partitions;
- sink/liveness.py: the progress record, heartbeats, slow-S3 warnings.

Rebalance callbacks run inside `consume()`, on this thread; what a revoke
and a loss do to the round in flight is sink/round.py's.

Each loop iteration: consume up to `consume_batch` records -> route each
into its partition's batcher (probing the key of the first batch after an
assignment or rewind) -> seal batches by age -> commit the round in flight
if its uploads are done, start the next -> until-done check.
"""

from __future__ import annotations

import functools
import gc
import signal
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from schemas import RunSpec, SinkProgress
from schemas.progress import sink_key
from sink import counters, store_check
from sink.committer import Committer
from sink.config import SinkConfig
from sink.errors import S3Failed
from sink.intake import Intake
from sink.liveness import Liveness, busy_since
from sink.metrics import SinkMetrics
from sink.object_store import ObjectStore
from sink.ownership import Ownership
from sink.periodic_checks import check_done, check_fetching, update_lag
from sink.probes import Probes
from sink.round import Rounds
from sink.s3_attempts import S3Errors
from sink.s3_writer import S3Writer, make_client
from tokenmill import crashpoints
from tokenmill import progress as run_progress
from tokenmill.kafka import clients, groups, start_offsets, topics, transactions
from tokenmill.kafka.fetch_stall import Silence, look_interval
from tokenmill.kafka.stranded import StrandedRepair
from tokenmill.kafka.transactions import KafkaFatal
from tokenmill.log import get_logger
from tokenmill.settings import Settings
from tokenmill.watchdog import Watchdog

log = get_logger("tokenmill.sink")

LAG_INTERVAL_S = 5.0
# The committed-offset read at an assignment waits out an undecided
# transaction (start_offsets.COMMITTED_WAIT_S), within this.
COMMITTED_GUARD_S = 60.0
ROUND_POLL_S = 0.01


def tune_gc() -> None:
    """For a process that runs the sink: what exists at start-up lives as long
    as the process, so keep it out of the collector's way, and collect the
    young generation less often (the loop allocates a few short-lived
    containers per record, none in cycles)."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


class SinkService:
    """Parameters: `settings`, `spec` (the run), `config` (`SinkConfig`),
    `metrics` (a `SinkMetrics`; a private one by default), `clock`
    (monotonic seconds), `s3_client` (a boto3 client; made from settings by
    default)."""

    # The jobs, made by `_serve` once the clients they call exist.
    _ownership: Ownership
    _probes: Probes
    _rounds: Rounds
    _intake: Intake

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
        self._s3_client = s3_client
        self._stopping = False
        self._closing = False  # inside close(): see _on_assign
        self._consumer: Any = None
        self._liveness: Liveness | None = None
        self._unstarted = SinkProgress(run=spec.run_id, instance=config.instance)
        self.watchdog = Watchdog(f"sink {config.instance}", stall_s=config.stall_s)
        # Classic protocol: partitions no member owns are taken back by one
        # member rejoining.
        self._stranded = StrandedRepair(f"{config.instance}#", grace_s=10.0,
                                        rejoin=self._rejoin)
        # What the consumer last heard of each owned partition: one silent
        # while records wait means the client stopped fetching it.
        self._silence: Silence[int] = Silence(limit_s=config.fetch_stall_s)
        self._lookups = functools.cache(lambda: clients.admin(settings))  # made once, if ever
        self._made_at = clock()  # the first heartbeat is due one interval after this
        self._s3_errors = S3Errors()

    @property
    def progress(self) -> SinkProgress:
        """This instance's counters as last committed (zeros before it started)."""
        return self._liveness.progress if self._liveness is not None else self._unstarted

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
        writer = S3Writer(client=client, bucket=config.bucket,
                          conditional_writes=config.conditional_writes)
        writer.ensure_bucket(create=config.create_bucket, region=self.settings.s3_region)
        store_check.check(writer, endpoint=self.settings.s3_endpoint_url,
                          region=self.settings.s3_region, prefix=config.prefix, run=config.run,
                          instance=config.instance, max_batch_bytes=config.limits.max_bytes)

        self.watchdog.start()
        try:
            self._serve(writer)
        finally:
            self.watchdog.stop()
        progress = self.progress
        log.info("sink stopped", s3_records=progress.s3_records,
                 s3_objects=progress.s3_objects, dlq_records=progress.dlq_records)
        return 0

    def _serve(self, writer: S3Writer) -> None:
        config = self.config
        # Fences an earlier incarnation and aborts its open transaction, so the
        # progress value read next is final.
        txns = transactions.start(self.settings, config.transactional_id,
                                  timeout_s=config.step_timeout_s,
                                  transaction_timeout_s=config.transaction_timeout_s,
                                  watchdog=self.watchdog)
        producer = txns.producer
        run_progress.ensure_topic(self.settings, config.run)
        key = sink_key(config.run, config.instance)
        progress = counters.start(config.run, config.instance,
                                  run_progress.read_one(self.settings, key))
        group = topics.sink_group(config.run)
        if config.group_protocol == "consumer" and config.session_timeout_s:
            groups.set_session_timeout(clients.admin(self.settings), group,
                                       config.session_timeout_s, self.settings.connect_timeout_s)
        consumer = self._consumer = clients.consumer(self.settings, group,
                                                     config.consumer_settings)
        committer = Committer(
            transactions=txns,
            group_metadata=consumer.consumer_group_metadata,
            source_topic=self.topic, dlq_topic=self.dlq_topic,
            progress_topic=topics.progress_topic(config.run), progress_key=key)
        log.info("sink started", run=config.run, instance=config.instance, bucket=config.bucket,
                 prefix=config.prefix, compression=config.compression,
                 batch_size=config.limits.max_records, max_batch_bytes=config.limits.max_bytes,
                 max_batch_age_s=config.limits.max_age_s, s3_records=progress.s3_records,
                 dlq_records=progress.dlq_records, group_protocol=config.group_protocol)
        store = ObjectStore(writer=writer, config=config, topic=self.topic,
                            settings_hash=self.spec.settings_hash, metrics=self.metrics)
        liveness = self._wire(store, committer, progress)
        done = run_progress.ProgressTail(self.settings, config.run) if config.until_done else None
        metrics_server = None
        failure: BaseException | None = None
        try:
            if config.metrics_port:
                metrics_server = self.metrics.serve(config.metrics_port)
            self._subscribe()
            self._loop(liveness, done)
            liveness.heartbeat(uploading_since=self._s3_busy_since(), final=True)  # stopped
        except BaseException as exc:
            failure = exc
            if isinstance(exc, S3Failed):
                liveness.record_failure(exc, uploading_since=self._s3_busy_since())
            raise
        finally:
            if not isinstance(failure, KafkaFatal):  # crash-only: nothing to close then
                self._close(store, producer, failure is not None)
            if metrics_server is not None:
                metrics_server.shutdown()
            if done is not None:
                done.close()

    def _wire(self, store: ObjectStore, committer: Committer, progress: SinkProgress) -> Liveness:
        """Make the jobs, each with the collaborators it calls."""
        config = self.config
        self._probes = Probes(lookup=store.lookup, seek=self._seek)
        self._ownership = Ownership(limits=config.limits, clock=self.clock, metrics=self.metrics,
                                    probes=self._probes, seek=self._seek)
        liveness = self._liveness = Liveness(
            progress=progress, committer=committer, ownership=self._ownership,
            s3_errors=self._s3_errors, heartbeat_s=config.heartbeat_s, clock=self.clock,
            last_commit=self._made_at)
        self._rounds = Rounds(ownership=self._ownership, upload=store.upload,
                              committer=committer, liveness=liveness, metrics=self.metrics)
        self._intake = Intake(spec=self.spec, run=config.run, instance=config.instance,
                              topic=self.topic, ownership=self._ownership, probes=self._probes,
                              metrics=self.metrics, silence=self._silence, clock=self.clock)
        return liveness

    def _close(self, store: ObjectStore, producer: Any, failed: bool) -> None:
        """Leave the group (SIGTERM: at once, so the partitions move now) and
        flush. Never raises: a second error must not hide the first."""
        try:
            store.shutdown()
            if failed:
                # A round still here is abandoned, not committed by the revoke
                # that close() runs: the next owner replays it.
                self._rounds.abandon()
            self._closing = True
            crashpoints.reached("group.closing", 1)
            with self.watchdog.guard("closing the consumer", 60):
                self._consumer.close()
            if not failed:
                with self.watchdog.guard("flushing the producer", 30):
                    producer.flush(5)
        except Exception as exc:  # noqa: BLE001 - logged; the first error is what counts
            log.warning("closing the sink's clients", error=str(exc))

    # -- the consumer --------------------------------------------------------

    def _subscribe(self) -> None:
        self._consumer.subscribe([self.topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _rejoin(self) -> None:
        self._consumer.unsubscribe()
        self._subscribe()

    def _seek(self, partition: int, offset: int) -> None:
        self._consumer.seek(TopicPartition(self.topic, partition, offset))
        self._silence.restarted(partition, offset, self.clock())

    # Rebalance callbacks: they run inside consume(), on this thread.

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if self._closing:
            start_offsets.assign_unread(consumer, partitions, who=f"sink {self.config.instance}")
            return
        # Read from the committed offsets, once no transaction holds them
        # undecided (tokenmill/kafka/start_offsets.py), assigned explicitly.
        with self.watchdog.guard("reading committed offsets", COMMITTED_GUARD_S):
            start = start_offsets.committed_offsets(
                consumer, partitions, timeout_s=max(5.0, self.settings.connect_timeout_s),
                who=f"sink {self.config.instance}")
        start_offsets.place(partitions, start)
        consumer.incremental_assign(partitions)
        self._ownership.assign(tp.partition for tp in partitions)
        now = self.clock()
        self._silence.owned((tp.partition for tp in partitions), now)
        for tp in partitions:
            if tp.offset >= 0:
                self._silence.restarted(tp.partition, tp.offset, now)

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rounds.leave((tp.partition for tp in partitions), lost=False)
        self._silence.dropped(tp.partition for tp in partitions)

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rounds.leave((tp.partition for tp in partitions), lost=True)
        self._silence.dropped(tp.partition for tp in partitions)

    # -- the loop ------------------------------------------------------------

    def _loop(self, liveness: Liveness, done: run_progress.ProgressTail | None) -> None:
        """Until stopped; with `done` (--until-done), until it says the run
        is persisted."""
        config = self.config
        ownership, probes, rounds = self._ownership, self._probes, self._rounds
        next_done_check = 0.0
        next_lag = 0.0
        next_fetch_check = 0.0
        while not self._stopping:
            self.watchdog.beat()
            # While uploads are in flight, come back quickly to commit them.
            timeout = ROUND_POLL_S if rounds.in_flight is not None else config.poll_timeout_s
            for message in self._consumer.consume(num_messages=config.consume_batch,
                                                  timeout=timeout):
                self._intake.take(message)
            self._silence.polled()
            probes.finish(ownership.batchers)
            ownership.tick()
            rounds.advance(wait=ownership.pending_bytes > config.max_buffer_bytes,
                           start=not self._stopping)
            now = self.clock()
            if now >= next_lag:
                update_lag(self._consumer, self.topic, ownership.batchers, self.metrics)
                if config.group_protocol == "classic":
                    self._stranded.check(clients.admin(self.settings),
                                         topics.sink_group(config.run), self.topic,
                                         self.spec.partitions)
                next_lag = now + LAG_INTERVAL_S
            if now >= next_fetch_check:
                check_fetching(self._silence, self._lookups, self.topic,
                               topics.sink_group(config.run), now)
                next_fetch_check = now + look_interval(config.fetch_stall_s)
            if liveness.due(now):
                liveness.heartbeat(uploading_since=self._s3_busy_since())
            liveness.log_slow_s3(since=self._s3_busy_since(), uploading=rounds.uploading,
                                 probing=probes.partitions)
            if (done is not None and now >= next_done_check and rounds.in_flight is None
                    and ownership.all_at_end()):
                if check_done(done, ownership, lambda: rounds.advance(start=not self._stopping)):
                    return
                next_done_check = self.clock() + config.done_check_interval_s
        # Stopping: the uploads in flight finish and commit; open batches are
        # left for the next owner to replay.
        rounds.finish(commit=True)

    def _s3_busy_since(self) -> float:
        """Start of the oldest S3 call in flight (upload round or probe), 0: none."""
        return busy_since(self._probes.busy_since(), self._rounds.busy_since())
