"""The generation worker: one per GPU, next to its SGLang server.

One asyncio event loop owns the worker's group members (consumer/
membership.py), the transactional producer and every transaction call. The
loop wires the worker's jobs and owns none of their state; each iteration:

- intake (consumer/intake.py): poll without blocking, pause when the
  buffer stays full or the server is down, take each record into the state
  of the slot that fetched it;
- dispatch (consumer/dispatch.py): start requests up to the in-flight
  limit, the limit being the server watch's (consumer/server_watch.py);
- parked partitions past their time are dropped (consumer/ownership.py);
- commit when due (consumer/committer.py, consumer/checkpoint.py): the
  contiguous finished prefix of each partition with its input offsets in
  one transaction (tokenmill/kafka/transactions.py, KIP-447); transactions
  are opened only to commit, never held across LLM calls;
- close the slots that finished handing a partition over (consumer/
  balancing.py, whose task opens and closes slots so that this worker's
  share follows its measured capacity).

Rebalance: on revoke, commit the ready prefix of the revoked partitions,
then park them (their requests go on) until the worker's next slot takes
them or a few seconds pass; on lost, commit nothing and drop them.

Crash-only: every blocking Kafka call is bounded by the watchdog; a fenced
or fatal client, or one that stopped fetching the partitions it holds
(consumer/fetch_watch.py), ends the process with one line and exit code 1.

`regenerate-turns` runs also read `tokenmill.<run>.turns` (consumer/
turn_chain.py).
"""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections.abc import Sequence

from confluent_kafka import Producer, TopicPartition

from consumer.balancing import Balancing
from consumer.checkpoint import Vitals
from consumer.committer import Committer
from consumer.config import WorkerConfig
from consumer.dispatch import Dispatch
from consumer.errors import FatalWorkerError
from consumer.fetch_watch import FetchWatch
from consumer.generation import Generator
from consumer.intake import Intake
from consumer.membership import Membership, MembershipConfig, Slot
from consumer.metrics import ConsumerMetrics
from consumer.ownership import Key, Ownership
from consumer.partitions import PartitionState
from consumer.server_watch import ServerWatch
from consumer.sglang_client import SGLangClient
from consumer.turn_chain import TurnChain
from schemas import RunSpec
from tokenmill import progress, run_done
from tokenmill.kafka import clients, groups, start_offsets, topics, transactions
from tokenmill.kafka.transactions import KafkaFatal, TransactionHooks
from tokenmill.log import get_logger
from tokenmill.settings import Settings
from tokenmill.startup import StartupLaps
from tokenmill.watchdog import Watchdog

__all__ = ["FatalWorkerError", "Worker", "WorkerConfig"]

log = get_logger("tokenmill.consumer")


class Worker:
    """Parameters: `settings`, `spec` (the run), `config`, `hooks` (observe
    each transaction step; tests fail or crash one), `startup` (the laps of
    the start so far, logged with the first request). `run()` returns the
    exit code, or raises FatalWorkerError."""

    def __init__(self, settings: Settings, spec: RunSpec, config: WorkerConfig,
                 hooks: TransactionHooks | None = None,
                 startup: StartupLaps | None = None) -> None:
        self.settings = settings
        self._startup: StartupLaps | None = startup or StartupLaps()
        self.spec = spec
        self.config = config
        self.hooks = hooks
        self.run_id = spec.run_id
        self.group = topics.generate_group(spec.run_id)
        self.metrics = ConsumerMetrics()
        self.watchdog = Watchdog(f"worker {config.instance}", stall_s=config.stall_s)
        self.stopping = False
        self.exit_code = 0
        self.fatal: BaseException | None = None
        self.run_done = False  # every prompt of the run has a committed result
        self._wake = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []
        self._producer: Producer | None = None
        self.chain = TurnChain(spec)
        self.ownership = Ownership(prompts_topic=self.chain.prompts_topic,
                                   park_s=config.park_s, metrics=self.metrics)
        self._members = Membership(
            settings=settings, group=self.group, topics=self.chain.input_topics,
            worker=config.instance,
            config=MembershipConfig(
                protocol=config.group_protocol, session_timeout_s=config.session_timeout_s,
                instance_id=config.instance if config.static_membership else None),
            on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost,
            want_paused=lambda: self._members.paused, watchdog=self.watchdog)
        self.committer = Committer(
            run_id=spec.run_id, config=config, ownership=self.ownership, members=self._members,
            chain=self.chain, metrics=self.metrics, vitals=self._vitals,
            on_fatal=self._fail_fatally)
        self.server = ServerWatch(config=config, spec=spec, metrics=self.metrics,
                                  wake=self._wake.set, on_breaker=self.committer.heartbeat_soon)
        self.fetch_watch = FetchWatch(limit_s=config.fetch_stall_s,  # admin made once, if ever
                                      admin=functools.cache(lambda: clients.admin(settings)))
        self.intake = Intake(ownership=self.ownership, chain=self.chain,
                             instance=config.instance, wake=self._wake.set,
                             fetch_watch=self.fetch_watch)
        self.dispatch = Dispatch(ownership=self.ownership, chain=self.chain, metrics=self.metrics,
                                 wake=self._wake.set, on_fatal=self._fail_fatally)
        self.balancing = Balancing(
            settings=settings, config=config, spec=spec, group=self.group,
            topic=self.chain.prompts_topic, chained=self.chain.chained, members=self._members,
            ownership=self.ownership, metrics=self.metrics,
            latency_s=lambda: self.dispatch.latency_s)

    @property
    def states(self) -> dict[Key, PartitionState]:
        """The held partitions' states by (topic, partition)."""
        return self.ownership.by_key()

    @property
    def in_flight(self) -> int:
        return self.ownership.in_flight

    # -- set-up ---------------------------------------------------------------

    def _make_clients(self) -> None:
        settings, config = self.settings, self.config
        clients.check_broker(settings)
        txns = transactions.start(
            settings, topics.transactional_id(self.run_id, "consumer", config.instance),
            config={"linger.ms": 20, "queue.buffering.max.messages": 200_000},
            timeout_s=config.step_timeout_s, transaction_timeout_s=config.transaction_timeout_s,
            hooks=self.hooks, watchdog=self.watchdog)
        self._producer = txns.producer
        self._lap("transactions")
        self.committer.start(txns, progress.read_one(settings, self.committer.progress_key))
        self._lap("progress record")
        if config.group_protocol == "consumer" and config.session_timeout_s:
            groups.set_session_timeout(clients.admin(settings), self.group,
                                       config.session_timeout_s, settings.connect_timeout_s)
        for _ in range(self.balancing.initial_slots()):
            self._members.open()
        self._lap("group")

    def _lap(self, step: str) -> None:
        if self._startup is not None:
            self._startup.lap(step)

    # -- rebalance callbacks (inside consume()/close(), on the loop thread) ------

    def _on_assign(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        committed = self._members.committed(slot, partitions)
        self.ownership.assign(slot.name, partitions, committed)  # sets a resumed one's offset
        start_offsets.place(partitions, committed)
        self.fetch_watch.assigned(slot.name, partitions, committed)

    def _on_revoke(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        self._commit(only=self.ownership.of_slot(slot.name, partitions))
        self.ownership.revoke(slot.name, partitions,
                              park=not self.stopping and self.fatal is None)
        self.fetch_watch.gone(slot.name, partitions)

    def _on_lost(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        self.ownership.lose(slot.name, partitions)
        self.fetch_watch.gone(slot.name, partitions)

    # -- the jobs' calls ---------------------------------------------------------

    def _commit(self, only: Sequence[PartitionState] | None = None) -> int:
        if self.fatal is not None:
            return 0
        return self.committer.commit(only)

    def _vitals(self) -> Vitals:
        return Vitals(concurrency_limit=self.server.limit, in_flight=self.ownership.in_flight,
                      breaker=self.server.breaker_cause, server=self.server.snapshot,
                      partitions=len(self.ownership.states()))

    def _apply_pause(self) -> None:
        self.intake.apply_pause(self._members, limit=self.server.limit, stopping=self.stopping,
                                server_up=self.server.up)

    def _start_tasks(self) -> None:
        if not self.stopping and self.server.serving:
            self.dispatch.start(limit=self.server.limit, draining=self.balancing.draining)
            if self._startup is not None and self.ownership.in_flight:
                self._lap("first prompt")
                log.info("first request", startup_s=self._startup.summary())
                self._startup = None

    def _fail_fatally(self, error: BaseException) -> None:
        if self.fatal is None:
            self.fatal = error
            log.error("stopping", error=str(error))
        self.stopping = True
        self._wake.set()

    async def _done_watch(self) -> None:
        state = await run_done.wait_until(
            self.settings, self.run_id, lambda s: s.generation_done,
            interval_s=self.config.done_check_interval_s, stopping=self._stopping)
        if state is not None:
            log.info("run fully generated; stopping", published=state.published,
                     generated=state.generated)
            self.run_done = True
            self.request_stop()

    def request_stop(self) -> None:
        if not self.stopping:
            log.info("stopping", in_flight=self.in_flight, hand_over=self.balancing.hands_over())
        self.stopping = True
        self._wake.set()

    # -- main loop ---------------------------------------------------------------

    async def run(self) -> int:
        self.watchdog.start()
        try:
            self._make_clients()
            await self._serve()
        except KafkaFatal as exc:
            self._fail_fatally(exc)
        finally:
            self._shutdown()
            self.watchdog.stop()
        if self.fatal is not None:
            raise FatalWorkerError(str(self.fatal))
        return self.exit_code

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError):
                pass
        config = self.config
        if config.metrics_port:
            self.metrics.serve(config.metrics_port)
        async with SGLangClient(config.sglang_url, request_timeout_s=config.request_timeout_s,
                                max_connections=config.max_concurrency,
                                api_key=config.api_key) as client:
            try:
                await self.server.start(client)
                self._lap("server limits")
                self.dispatch.use(Generator(
                    client=client, gate=self.server.gate, spec=self.spec,
                    instance=config.instance, retry=config.retry, breaker=self.server.breaker,
                    on_retry=lambda kind: self.metrics.retries.labels(kind).inc(),
                    on_latency=self.dispatch.observe_latency, on_breaker=self.server.on_breaker))
                self._start_background(client)
                log.info("consuming", run=self.run_id, instance=config.instance,
                         topic=self.chain.prompts_topic, server=config.sglang_url,
                         group_protocol=config.group_protocol,
                         concurrency=config.concurrency or f"auto (start {self.server.limit})")
                await self._loop()
                await self._finish()
            finally:
                for task in self._background:
                    task.cancel()
                self.server.close()

    def _start_background(self, client: SGLangClient) -> None:
        loop = asyncio.get_running_loop()
        self._background.append(loop.create_task(
            self.server.watch(client, lambda: self.ownership.in_flight, self._stopping)))
        if self.config.until_done:
            self._background.append(loop.create_task(self._done_watch()))
        self._background.append(loop.create_task(self.balancing.run(self._stopping)))
        self._background.append(loop.create_task(
            self.fetch_watch.run(self._stopping, self._fail_fatally)))

    def _stopping(self) -> bool:
        return self.stopping

    def _step(self) -> None:
        """One round of the jobs that keep a member alive and its results moving."""
        self.watchdog.beat()
        self.intake.poll(self._members, self.server.limit)
        self._apply_pause()

    async def _loop(self) -> None:
        while not self.stopping:
            self._step()
            self._start_tasks()
            self.ownership.expire_parked()
            if self.committer.due():
                self._commit()
            self.balancing.close_drained()
            await self._idle(0.05)

    async def _idle(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    async def _finish(self) -> None:
        """Stopping: hand over at once, or drain (bounded) when alone."""
        if self.fatal is not None:
            return
        self._apply_pause()
        if not self.balancing.hands_over():
            deadline = time.monotonic() + self.config.drain_timeout_s
            while self.in_flight > 0 and time.monotonic() < deadline and self.fatal is None:
                self._step()  # polling keeps the group membership alive
                self.ownership.expire_parked()
                if self.committer.due():
                    self._commit()
                await self._idle(0.1)
            if self.in_flight:
                log.warning("drain timeout: abandoning in-flight requests",
                            in_flight=self.in_flight)
        self.committer.final = True
        self._commit()
        if self.run_done:
            return  # nothing left for anyone: no need to hand partitions over
        # Leaving the group revokes every partition: the revoke commits what
        # is ready and drops the rest (counted as wasted).
        self._members.close_all()
        self.ownership.drop_parked("shutdown")

    def _shutdown(self) -> None:
        """Never raises: a second error must not hide the first. After a fatal
        error nothing is closed: the broker may not answer, and the members'
        sessions expire by themselves (crash-only)."""
        if self.fatal is not None:
            return
        try:
            if not self.run_done:
                self._members.close_all()
            if self._producer is not None:
                with self.watchdog.guard("flushing the producer", 30):
                    self._producer.flush(10)
        except Exception as exc:  # noqa: BLE001 - logged; the exit code says the rest
            log.warning("shutting down", error=str(exc))
        log.info("stopped", instance=self.config.instance, committed=self.committer.committed,
                 wasted=self.ownership.wasted)
