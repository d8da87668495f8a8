"""The generation worker: one per GPU, next to its SGLang server.

One asyncio event loop owns the Kafka consumer, the transactional producer
and every transaction call (confluent-kafka serializes consumer calls across
threads; one owner keeps that trivial). The loop polls without blocking,
starts requests up to the in-flight limit, and every few seconds commits
the contiguous finished prefix of each partition together with its input
offsets in one transaction (KIP-447). Transactions are opened only to commit,
never held across LLM calls.

Rebalance: on revoke, commit the ready prefix of the revoked partitions, then
cancel and forget their in-flight work; on lost, commit nothing.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from consumer import counters
from consumer.backoff import RetryPolicy
from consumer.concurrency import AutoBounds, next_limit, parse_metrics
from consumer.health import HealthGate
from consumer.metrics import ConsumerMetrics
from consumer.sglang_client import (
    PromptRejected,
    Retryable,
    ServerMisconfigured,
    ServerUnavailable,
    SGLangClient,
    request_body,
)
from consumer.transaction import (
    CommitAborted,
    CommitFatal,
    PartitionCommit,
    TransactionalCommitter,
)
from consumer.watermark import Watermark
from schemas import Completion, Failure, PromptRecord, RunSpec
from schemas.completion import CompletionRecord
from schemas.progress import ConsumerProgress, consumer_key, decode_progress
from tokenmill import kafka_clients, progress, topics
from tokenmill.log import get_logger
from tokenmill.registry import source_prompts_topic
from tokenmill.settings import Settings

log = get_logger("tokenmill.consumer")

_prompt_decoder = msgspec.json.Decoder(PromptRecord)

# A buffer full for this long means the server is the bottleneck: pause the
# partitions and keep polling (max.poll.interval.ms stays at its default).
PAUSE_AFTER_FULL_S = 10.0


class WorkerConfig(msgspec.Struct, frozen=True, kw_only=True):
    instance: str
    sglang_url: str
    concurrency: int | None = None  # None = auto from SGLang's /metrics
    max_concurrency: int = 1024
    initial_concurrency: int = 16
    commit_interval_s: float = 2.0
    commit_max_records: int = 5000
    retry: RetryPolicy = RetryPolicy()
    request_timeout_s: float = 1800.0
    drain_timeout_s: float = 60.0
    session_timeout_ms: int = 30_000
    static_membership: bool = True
    until_done: bool = False
    done_check_interval_s: float = 3.0
    metrics_port: int = 0
    health_interval_s: float = 1.0
    auto_interval_s: float = 1.0
    api_key: str | None = None


class FatalWorkerError(RuntimeError):
    """The worker cannot go on (fenced, misconfigured server)."""


@dataclass
class PartitionState:
    partition: int
    watermark: Watermark[CompletionRecord] = field(default_factory=Watermark)
    queue: deque[tuple[int, PromptRecord]] = field(default_factory=deque)
    tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    retries: int = 0  # retries of results not committed yet
    committed: int | None = None


class Worker:
    def __init__(self, settings: Settings, spec: RunSpec, config: WorkerConfig) -> None:
        self.settings = settings
        self.spec = spec
        self.config = config
        self.run_id = spec.run_id
        self.settings_hash = spec.settings_hash
        self.prompts_topic = source_prompts_topic(spec)
        self.completions_topic = topics.completions_topic(spec.run_id)
        self.progress_key = consumer_key(spec.run_id, config.instance)
        self.metrics = ConsumerMetrics()
        self.states: dict[int, PartitionState] = {}
        self.limit = config.concurrency or config.initial_concurrency
        self.in_flight = 0
        self.stopping = False
        self.exit_code = 0
        self.fatal: BaseException | None = None
        self.paused = False
        self._full_since: float | None = None
        self.wasted: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._last_commit = time.monotonic()
        self._progress = ConsumerProgress(run=spec.run_id, instance=config.instance)
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._committer: TransactionalCommitter | None = None
        self._client: SGLangClient | None = None
        self._gate: HealthGate | None = None
        self._background: list[asyncio.Task[Any]] = []

    # -- set-up ---------------------------------------------------------------

    def _make_clients(self) -> None:
        settings = self.settings
        kafka_clients.check_broker(settings)
        txn_id = f"tokenmill.{self.run_id}.consumer.{self.config.instance}"
        self._producer = kafka_clients.transactional_producer(
            settings, txn_id, {"linger.ms": 20, "queue.buffering.max.messages": 200_000}
        )
        # Fences a previous incarnation and aborts its open transaction.
        self._producer.init_transactions(60)
        raw = progress.read_one(settings, self.progress_key)
        if raw is not None:
            previous = decode_progress(raw)
            if isinstance(previous, ConsumerProgress):
                self._progress = previous
        if not self._progress.started_at:
            self._progress = msgspec.structs.replace(self._progress, started_at=time.time())
        extra: dict[str, Any] = {
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": self.config.session_timeout_ms,
            "heartbeat.interval.ms": max(500, self.config.session_timeout_ms // 10),
            "queued.max.messages.kbytes": 16384,
        }
        if self.config.static_membership:
            extra["group.instance.id"] = self.config.instance
        self._consumer = kafka_clients.consumer(settings, topics.generate_group(self.run_id), extra)
        self._committer = TransactionalCommitter(
            producer=self._producer, prompts_topic=self.prompts_topic,
            completions_topic=self.completions_topic,
            progress_topic=topics.progress_topic(self.run_id), progress_key=self.progress_key,
            group_metadata=self._consumer.consumer_group_metadata)
        self._consumer.subscribe([self.prompts_topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)

    # -- rebalance callbacks (run inside consume(), on the loop thread) --------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.states[tp.partition] = PartitionState(tp.partition)
        consumer.incremental_assign(partitions)
        if self.paused and partitions:
            consumer.pause(partitions)
        self.metrics.assigned.set(len(self.states))
        log.info("partitions assigned", partitions=sorted(tp.partition for tp in partitions),
                 now=sorted(self.states))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        revoked = {tp.partition for tp in partitions}
        try:
            self._commit(only=revoked)
        except KafkaException as exc:
            log.warning("commit on revoke failed; the next owner replays", error=str(exc))
        self._drop(revoked, "revoked")
        log.info("partitions revoked", partitions=sorted(revoked), now=sorted(self.states))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {tp.partition for tp in partitions}
        self._drop(lost, "lost")
        log.warning("partitions lost; their uncommitted work is dropped",
                    partitions=sorted(lost))

    def _drop(self, partitions: set[int], reason: str) -> None:
        wasted = 0
        for p in partitions:
            state = self.states.pop(p, None)
            if state is None:
                continue
            for task in state.tasks.values():
                task.cancel()
            wasted += len(state.tasks) + state.watermark.waiting + state.watermark.ready_count()
            self.in_flight -= len(state.tasks)
            state.tasks.clear()
        if wasted:
            self.wasted[reason] = self.wasted.get(reason, 0) + wasted
            self.metrics.wasted.labels(reason).inc(wasted)
        self.metrics.assigned.set(len(self.states))
        self.metrics.in_flight.set(self.in_flight)

    # -- pause / resume ---------------------------------------------------------

    def _buffered(self) -> int:
        return sum(len(s.queue) for s in self.states.values())

    def _want_pause(self) -> bool:
        """Pause fetching while the server is down, while draining, and when
        the local buffer has stayed full for a while (a slow GPU): paused
        partitions let us keep polling, and so keep our group membership,
        without fetching more. Short bursts of a full buffer do not pause:
        resuming costs a fetch round trip and would starve a fast server."""
        gate_open = self._gate.is_open if self._gate else True
        if self.stopping or not gate_open:
            return True
        buffered = self._buffered()
        now = time.monotonic()
        if buffered < self.limit:
            self._full_since = None
        elif self._full_since is None:
            self._full_since = now
        if self.paused:
            return buffered > self.limit // 2
        return self._full_since is not None and now - self._full_since >= PAUSE_AFTER_FULL_S

    def _apply_pause(self) -> None:
        assert self._consumer is not None
        want = self._want_pause()
        if want == self.paused:
            return
        assignment = self._consumer.assignment()
        if assignment:
            (self._consumer.pause if want else self._consumer.resume)(assignment)
        self.paused = want

    # -- fetching and generating ----------------------------------------------

    def _poll(self) -> None:
        assert self._consumer is not None
        room = self.limit - self._buffered()
        if room <= 0 and not self.paused:
            # Leave the records in librdkafka's queue for now. Not calling
            # consume() is safe: _want_pause pauses the partitions long before
            # max.poll.interval.ms, and paused partitions are polled again.
            return
        messages = self._consumer.consume(num_messages=max(1, min(room, 1000)), timeout=0)
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error", error=str(error))
                continue
            state = self.states.get(message.partition())
            if state is None:  # a late message of a partition we no longer own
                continue
            offset = message.offset()
            try:
                prompt = _prompt_decoder.decode(message.value())
            except msgspec.DecodeError as exc:
                prompt = None
                log.error("undecodable prompt record", partition=message.partition(),
                          offset=offset, error=str(exc))
            state.watermark.track(offset)
            if prompt is None:
                state.watermark.finish(offset, self._undecodable(message))
                continue
            state.queue.append((offset, prompt))

    def _undecodable(self, message: Any) -> Failure:
        placeholder = PromptRecord(id=(message.key() or b"").decode(errors="replace") or
                                   f"{message.partition()}-{message.offset()}",
                                   run=self.run_id, messages=(), source="?", format="?",
                                   category="plain")
        return Failure(id=placeholder.id, run=self.run_id, settings_hash=self.settings_hash,
                       prompt=placeholder, failure="bad_request",
                       error="prompt record could not be decoded", instance=self.config.instance)

    def _start_tasks(self) -> None:
        if self.stopping or (self._gate is not None and not self._gate.is_open):
            return
        loop = asyncio.get_running_loop()
        while self.in_flight < self.limit:
            started = False
            for state in list(self.states.values()):
                if self.in_flight >= self.limit:
                    break
                if not state.queue:
                    continue
                offset, prompt = state.queue.popleft()
                task = loop.create_task(self._generate(state, offset, prompt))
                state.tasks[offset] = task
                self.in_flight += 1
                started = True
            if not started:
                break
        self.metrics.in_flight.set(self.in_flight)

    async def _generate(self, state: PartitionState, offset: int, prompt: PromptRecord) -> None:
        assert self._client is not None and self._gate is not None
        attempts = 0
        retries = 0
        started = time.monotonic()
        generation = self.spec.generation
        record: CompletionRecord
        try:
            while True:
                await self._gate.wait_open()
                attempts += 1
                try:
                    result = await self._client.chat(request_body(prompt, generation, attempts))
                except PromptRejected as exc:
                    record = self._failure(prompt, exc.kind, str(exc), exc.status, attempts, started)
                    break
                except Retryable as exc:
                    self.metrics.retries.labels(exc.kind).inc()
                    if self.config.retry.exhausted(attempts):
                        record = self._failure(prompt, exc.kind, str(exc), exc.status, attempts,
                                               started)
                        break
                    retries += 1
                    await asyncio.sleep(self.config.retry.delay(attempts))
                    continue
                except ServerUnavailable as exc:
                    attempts -= 1  # not the prompt's fault
                    self._gate.report_down(str(exc))
                    continue
                except ServerMisconfigured as exc:
                    self._fail_fatally(FatalWorkerError(
                        f"the server at {self.config.sglang_url} refuses requests: {exc}"))
                    return
                self.metrics.latency.observe(result.latency_s)
                record = Completion(
                    id=prompt.id, run=self.run_id, settings_hash=self.settings_hash,
                    prompt=prompt, finish_reason=result.finish_reason, content=result.content,
                    reasoning_content=result.reasoning_content, tool_calls=result.tool_calls,
                    matched_stop=result.matched_stop, usage=result.usage, spec=result.spec,
                    latency_s=round(time.monotonic() - started, 4), attempts=attempts,
                    instance=self.config.instance, model=result.model,
                )
                break
        except asyncio.CancelledError:
            return  # revoked or lost: the state was dropped already
        if self.states.get(state.partition) is not state:
            return  # revoked while finishing
        state.tasks.pop(offset, None)
        self.in_flight -= 1
        state.retries += retries
        state.watermark.finish(offset, record)
        self._wake.set()

    def _failure(self, prompt: PromptRecord, kind: str, error: str, status: int | None,
                 attempts: int, started: float) -> Failure:
        return Failure(id=prompt.id, run=self.run_id, settings_hash=self.settings_hash,
                       prompt=prompt, failure=kind, error=error[:2000],  # type: ignore[arg-type]
                       status=status, attempts=attempts, instance=self.config.instance,
                       latency_s=round(time.monotonic() - started, 4))

    def _fail_fatally(self, error: BaseException) -> None:
        if self.fatal is None:
            self.fatal = error
            log.error("stopping", error=str(error))
        self.stopping = True
        self._wake.set()

    # -- committing -------------------------------------------------------------

    def _ready_total(self) -> int:
        return sum(s.watermark.ready_count() for s in self.states.values())

    def _commit_due(self) -> bool:
        if time.monotonic() - self._last_commit >= self.config.commit_interval_s:
            return True
        return self._ready_total() >= self.config.commit_max_records

    def _commit(self, only: set[int] | None = None) -> int:
        """One transaction: ready results + counters + input offsets. Returns
        the number of records committed (0 when nothing was ready). Results
        stay in the watermarks until the commit succeeded."""
        assert self._committer is not None
        self._last_commit = time.monotonic()
        ready: list[tuple[PartitionState, PartitionCommit]] = []
        for p, state in self.states.items():
            if only is not None and p not in only:
                continue
            records, commit = state.watermark.peek_ready(self.config.commit_max_records)
            if records and commit is not None:
                ready.append((state, PartitionCommit(p, records, commit)))
        if not ready:
            return 0
        all_records = [r for _, part in ready for r in part.records]
        retries = sum(state.retries for state, _ in ready)
        new_progress = msgspec.structs.replace(
            counters.add_records(self._progress, all_records, retries),
            concurrency_limit=self.limit, in_flight=self.in_flight)
        started = time.monotonic()
        try:
            self._committer.commit([part for _, part in ready], new_progress)
        except CommitAborted as exc:
            self.metrics.commits.labels("aborted").inc()
            log.warning("transaction aborted; results stay queued for the next commit",
                        error=str(exc))
            return 0
        except CommitFatal as exc:
            self.metrics.commits.labels("aborted").inc()
            self._fail_fatally(FatalWorkerError(
                f"transactional producer fenced or broken ({exc}); another instance with id "
                f"{self.config.instance!r} may be running"))
            return 0
        for state, part in ready:
            state.watermark.take(len(part.records))
            state.retries = 0
            state.committed = part.next_offset
            self.metrics.committed_offset.labels(str(state.partition)).set(part.next_offset)
        self._progress = new_progress
        self.metrics.commits.labels("committed").inc()
        self.metrics.commit_seconds.observe(time.monotonic() - started)
        self._observe(all_records)
        return len(all_records)

    def _observe(self, records: list[CompletionRecord]) -> None:
        accept_sum = 0.0
        accept_n = 0
        for record in records:
            if isinstance(record, Failure):
                self.metrics.failures.labels(record.failure).inc()
                continue
            self.metrics.completions.labels(record.finish_reason).inc()
            self.metrics.prompt_tokens.inc(record.usage.prompt_tokens)
            self.metrics.completion_tokens.inc(record.usage.completion_tokens)
            if record.spec.accept_length is not None:
                accept_sum += record.spec.accept_length
                accept_n += 1
        if accept_n:
            self.metrics.accept_length.set(accept_sum / accept_n)

    # -- background loops -------------------------------------------------------

    async def _auto_concurrency(self) -> None:
        assert self._client is not None
        bounds = AutoBounds(maximum=self.config.max_concurrency)
        warned = False
        while not self.stopping:
            await asyncio.sleep(self.config.auto_interval_s)
            text = await self._client.metrics_text()
            load = parse_metrics(text) if text else None
            if load is None:
                if not warned:
                    log.warning("no SGLang metrics at /metrics (start SGLang with "
                                "--enable-metrics); keeping the in-flight limit", limit=self.limit)
                    warned = True
                continue
            new = next_limit(self.limit, load, self.in_flight, bounds)
            if new != self.limit:
                log.debug("in-flight limit", old=self.limit, new=new, running=load.running,
                          queued=load.queued, token_usage=load.token_usage)
                self.limit = new
                self.metrics.limit.set(new)
                self._wake.set()

    async def _initial_auto_limit(self) -> None:
        """Start at the server's own max running requests when it says so."""
        assert self._client is not None
        server_max = await self._client.max_running_requests()
        if server_max is not None:
            self.limit = max(1, min(self.config.max_concurrency, server_max))
            self.metrics.limit.set(self.limit)

    async def _done_watch(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.config.done_check_interval_s)
            state = await asyncio.to_thread(progress.read_run_progress, self.settings, self.run_id)
            if state.generation_done:
                log.info("run fully generated; stopping", published=state.published,
                         generated=state.generated)
                self.request_stop()
                return

    def request_stop(self) -> None:
        if not self.stopping:
            log.info("stopping: draining in-flight requests",
                     in_flight=self.in_flight, drain_timeout_s=self.config.drain_timeout_s)
        self.stopping = True
        self._wake.set()

    def _on_server_change(self, healthy: bool) -> None:
        self.metrics.server_up.set(1 if healthy else 0)
        self._wake.set()

    # -- main loop ---------------------------------------------------------------

    async def run(self) -> int:
        self._make_clients()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):
                pass
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port)
        self.metrics.limit.set(self.limit)
        self.metrics.server_up.set(1)
        async with SGLangClient(self.config.sglang_url,
                                request_timeout_s=self.config.request_timeout_s,
                                max_connections=self.config.max_concurrency,
                                api_key=self.config.api_key) as client:
            self._client = client
            self._gate = HealthGate(client.healthy, interval_s=self.config.health_interval_s,
                                    on_change=self._on_server_change)
            if self.config.concurrency is None:
                await self._initial_auto_limit()
                self._background.append(loop.create_task(self._auto_concurrency()))
            if self.config.until_done:
                self._background.append(loop.create_task(self._done_watch()))
            log.info("consuming", run=self.run_id, instance=self.config.instance,
                     topic=self.prompts_topic, server=self.config.sglang_url,
                     concurrency=self.config.concurrency or f"auto (start {self.limit})")
            try:
                await self._loop()
                await self._drain()
            finally:
                for task in self._background:
                    task.cancel()
                self._gate.close()
                self._shutdown()
        if self.fatal is not None:
            raise self.fatal
        return self.exit_code

    async def _loop(self) -> None:
        while not self.stopping:
            self._poll()
            self._apply_pause()
            self._start_tasks()
            if self._commit_due():
                self._commit()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=0.05)
            except asyncio.TimeoutError:
                pass

    async def _drain(self) -> None:
        """Stop fetching, let in-flight requests finish (bounded), commit."""
        if self.fatal is not None:
            return
        self._apply_pause()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            self._poll()  # keeps the group membership alive
            self._apply_pause()
            if self._commit_due():
                self._commit()
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=0.1)
            except asyncio.TimeoutError:
                pass
        self._commit()
        if self.in_flight:
            log.warning("drain timeout: abandoning in-flight requests", in_flight=self.in_flight)
            self._drop(set(self.states), "shutdown")

    def _shutdown(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()  # on_revoke commits anything still ready
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing the consumer", error=str(exc))
        if self._producer is not None:
            self._producer.flush(10)
        log.info("stopped", instance=self.config.instance, committed=self._progress.completions
                 + self._progress.failures, wasted=self.wasted)
