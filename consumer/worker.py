"""The generation worker: one per GPU, next to its SGLang server.

One asyncio event loop owns the worker's group members (consumer/
membership.py), the transactional producer and every transaction call. The
loop polls without blocking, starts requests up to the in-flight limit
(consumer/generation.py), and every few seconds commits the contiguous
finished prefix of each partition together with its input offsets in one
transaction (tokenmill/kafka/transactions.py, KIP-447). Transactions are opened
only to commit, never held across LLM calls.

Rebalance: on revoke, commit the ready prefix of the revoked partitions,
then park them (their requests go on) until the worker's next slot takes
them or a few seconds pass; on lost, commit nothing and drop them. A fleet
task (consumer/fleet.py) opens and closes the worker's slots so that its
share of the run follows its measured capacity.

Crash-only: every blocking Kafka call is bounded by the watchdog; a fenced
or fatal client ends the process with one line and exit code 1.

`regenerate-turns` runs: the worker also reads `tokenmill.<run>.turns` (same
group). Each input is one step of a conversation (consumer/turns.py); what
the step commits, in the same transaction as its input offset, is the next
turn (to `.turns`) or the finished conversation (to `.completions`), so each
step is generated once and any worker can take the next one.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterable
from typing import Any, Literal

import msgspec
from confluent_kafka import Message, Producer, TopicPartition

from consumer import counters
from consumer.backoff import RetryPolicy
from consumer.breaker import Breaker
from consumer.concurrency import AutoBounds, next_limit, parse_metrics
from consumer.fleet import FleetView, RateTracker, decide, initial_slots
from consumer.fleet_view import ViewUnavailable, read_view
from consumer.generation import Generator, Outcome, ServerRefuses
from consumer.handover import Handovers, drain_limit_s
from consumer.health import HealthGate
from consumer.membership import Membership, MembershipConfig, Slot
from consumer.metrics import ConsumerMetrics
from consumer.partitions import Input, Output, PartitionState, can_resume
from consumer.pause import PausePolicy
from consumer.recent_rate import RecentRate
from consumer.sglang_client import SGLangClient
from consumer.turns import advance, dataset_answerer, position_of
from consumer.validation import check_prompt, check_turn, invalid_record, topic_run
from schemas import Conversation, Failure, RunSpec
from schemas.completion import encode_record
from schemas.progress import ConsumerProgress, ServerSnapshot, consumer_key, decode_progress
from schemas.turn import TurnRecord
from tokenmill import progress
from tokenmill.kafka import clients, groups, topics, transactions
from tokenmill.kafka.transactions import (
    KafkaFatal,
    TransactionAborted,
    TransactionHooks,
    Transactions,
)
from tokenmill.log import get_logger
from tokenmill.registry import source_prompts_topic
from tokenmill.settings import Settings
from tokenmill.tool_results import load_hook
from tokenmill.watchdog import Watchdog

log = get_logger("tokenmill.consumer")

Drop = Literal["revoked", "lost", "moved", "shutdown"]
Key = tuple[str, int]  # (input topic, partition)


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
    group_protocol: groups.GroupProtocol = "consumer"
    # KIP-848: set as the group's consumer.session.timeout.ms when given;
    # classic: the client's session.timeout.ms.
    session_timeout_s: float | None = None
    static_membership: bool = False  # classic protocol only
    fleet_balancing: bool = True  # KIP-848 only: capacity-weighted slots
    fleet_interval_s: float = 3.0
    park_s: float = 3.0
    until_done: bool = False
    done_check_interval_s: float = 3.0
    metrics_port: int = 0
    health_interval_s: float = 1.0
    auto_interval_s: float = 1.0
    transaction_timeout_s: float = 20.0
    # An idle worker still commits its counters this often: `status` sees it
    # alive, and a duplicate --instance that fenced it is noticed.
    heartbeat_s: float = 10.0
    breaker_window: int = 20  # recent requests the circuit breaker looks at
    breaker_threshold: float = 0.9  # share of one failure cause that opens it
    breaker_cooldown_s: float = 30.0  # before the first probe (doubles, up to 10 min)
    stall_s: float = 120.0
    api_key: str | None = None


class FatalWorkerError(RuntimeError):
    """The worker cannot go on (fenced, misconfigured server)."""


class Worker:
    def __init__(self, settings: Settings, spec: RunSpec, config: WorkerConfig,
                 hooks: TransactionHooks | None = None) -> None:
        self.settings = settings
        self.spec = spec
        self.config = config
        self.hooks = hooks
        self.run_id = spec.run_id
        self.prompts_topic = source_prompts_topic(spec)
        self._topic_owner = topic_run(self.prompts_topic)
        self.completions_topic = topics.completions_topic(spec.run_id)
        # regenerate-turns: conversations between turns, read and written here.
        self.turns_topic = (topics.turns_topic(spec.run_id)
                            if spec.multi_turn == "regenerate-turns" else None)
        self.input_topics = (self.prompts_topic,) + ((self.turns_topic,) if self.turns_topic else ())
        self._tool_hook = load_hook(spec.tool_results) if spec.tool_results else None
        self.group = topics.generate_group(spec.run_id)
        self.progress_key = consumer_key(spec.run_id, config.instance)
        self.metrics = ConsumerMetrics()
        # By (input topic, partition).
        self.states: dict[Key, PartitionState] = {}
        self.parked: dict[Key, PartitionState] = {}
        self.limit = config.concurrency or config.initial_concurrency
        self.stopping = False
        self.exit_code = 0
        self.fatal: BaseException | None = None
        self.wasted: dict[str, int] = {}
        self.latency_s = 0.0  # moving average of request latency
        self.others_seen = False  # another worker was in the group at the last look
        self.run_done = False  # every prompt of the run has a committed result
        self._last_workers: frozenset[str] = frozenset()  # at the previous fleet view
        self.server: ServerSnapshot | None = None  # the server's last /metrics reading
        self._pause = PausePolicy()
        self._wake = asyncio.Event()
        self._last_commit = time.monotonic()
        self._last_committed = time.monotonic()
        self._progress = ConsumerProgress(run=spec.run_id, instance=config.instance)
        self._recent = RecentRate()
        # The last commit of a clean exit marks the instance stopped (not dead).
        self._final_commit = False
        self._producer: Producer | None = None
        self._txns: Transactions | None = None
        self._members: Membership | None = None
        self._client: SGLangClient | None = None
        self._gate: HealthGate | None = None
        self._generator: Generator | None = None
        self._rates = RateTracker()
        self._handovers = Handovers()  # donated slots draining before they close
        self.breaker = Breaker(window=config.breaker_window, threshold=config.breaker_threshold,
                               cooldown_s=config.breaker_cooldown_s)
        self._background: list[asyncio.Task[Any]] = []
        self.watchdog = Watchdog(f"worker {config.instance}", stall_s=config.stall_s)

    # -- set-up ---------------------------------------------------------------

    def _make_clients(self) -> None:
        settings = self.settings
        clients.check_broker(settings)
        self._txns = transactions.start(
            settings, topics.transactional_id(self.run_id, "consumer", self.config.instance),
            config={"linger.ms": 20, "queue.buffering.max.messages": 200_000},
            timeout_s=self.config.transaction_timeout_s, hooks=self.hooks,
            watchdog=self.watchdog)
        self._producer = self._txns.producer
        raw = progress.read_one(settings, self.progress_key)
        if raw is not None:
            previous = decode_progress(raw)
            if isinstance(previous, ConsumerProgress):
                self._progress = previous
        if not self._progress.started_at:
            self._progress = msgspec.structs.replace(self._progress, started_at=time.time())
        self._progress = msgspec.structs.replace(self._progress, stopped_at=0.0)
        self._recent.add(time.time(), self._progress.completions + self._progress.failures,
                         self._progress.completion_tokens)
        config = self.config
        if config.group_protocol == "consumer" and config.session_timeout_s:
            groups.set_session_timeout(clients.admin(settings), self.group,
                                       config.session_timeout_s, settings.connect_timeout_s)
        self._members = Membership(
            settings=settings, group=self.group, topics=self.input_topics,
            worker=config.instance,
            config=MembershipConfig(
                protocol=config.group_protocol, session_timeout_s=config.session_timeout_s,
                instance_id=config.instance if config.static_membership else None),
            on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost,
            want_paused=lambda: self._members is not None and self._members.paused,
            watchdog=self.watchdog)
        # Fleet balancing counts the prompts topic only: off for turn runs.
        balanced = (config.group_protocol == "consumer" and config.fleet_balancing
                    and self.turns_topic is None)
        for _ in range(initial_slots(self.spec.partitions, self.spec.gpus) if balanced else 1):
            self._members.open()


    # -- rebalance callbacks (inside consume()/close(), on the loop thread) ------

    def _on_assign(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        assert self._members is not None
        committed = self._members.committed(slot, partitions)
        resumed = []
        for tp in partitions:
            p = (tp.topic, tp.partition)
            stale = self.states.pop(p, None)
            if stale is not None:  # still held by another of our slots, which lost it
                log.warning("partition moved between this worker's slots before the old one "
                            "learned it; its uncommitted work is dropped",
                            partition=self._label(p), old_slot=stale.slot, slot=slot.name)
                self._drop_state(stale, "lost")
            parked = self.parked.pop(p, None)
            if parked is not None and can_resume(parked, committed.get(p)):
                parked.slot = slot.name
                parked.parked_until = None
                self.states[p] = parked
                tp.offset = parked.next_fetch() or tp.offset
                resumed.append(self._label(p))
                continue
            if parked is not None:
                self._drop_state(parked, "moved")
            self.states[p] = PartitionState(tp.partition, slot.name,
                                            start_offset=committed.get(p), topic=tp.topic)
        self.metrics.assigned.set(len(self.states))
        log.info("partitions assigned", slot=slot.name,
                 partitions=self._labels((tp.topic, tp.partition) for tp in partitions),
                 resumed=resumed, owned=self._labels(self.states))

    def _held_by(self, slot: Slot, partitions: list[TopicPartition]) -> set[Key]:
        """The partitions whose state this slot holds: a slot that lost a
        partition late must not touch the state another slot now holds."""
        return {(tp.topic, tp.partition) for tp in partitions
                if (state := self.states.get((tp.topic, tp.partition))) is not None
                and state.slot == slot.name}

    def _on_revoke(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        revoked = self._held_by(slot, partitions)
        self._commit(only=revoked)
        park = not self.stopping and self.fatal is None
        for p in revoked:
            state = self.states.pop(p)
            if park and state.tasks:
                state.parked_until = time.monotonic() + self.config.park_s
                self.parked[p] = state
            else:
                self._drop_state(state, "revoked")
        self.metrics.assigned.set(len(self.states))
        log.info("partitions revoked", slot=slot.name,
                 partitions=self._labels((tp.topic, tp.partition) for tp in partitions),
                 owned=self._labels(self.states))

    def _on_lost(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        for p in self._held_by(slot, partitions):
            self._drop_state(self.states.pop(p), "lost")
        self.metrics.assigned.set(len(self.states))
        log.warning("partitions lost; their uncommitted work is dropped", slot=slot.name,
                    partitions=self._labels((tp.topic, tp.partition) for tp in partitions))

    def _label(self, key: Key) -> int | str:
        """How logs and metric labels name an input partition: its number for
        the prompts (as always), `turns-<n>` for a regenerate-turns run's turns."""
        topic, partition = key
        return partition if topic == self.prompts_topic else f"turns-{partition}"

    def _labels(self, keys: Iterable[Key]) -> list[int | str]:
        return [self._label(k) for k in sorted(keys)]

    def _drop_state(self, state: PartitionState, reason: Drop) -> None:
        wasted = state.unfinished()
        state.cancel()
        if wasted:
            self.wasted[reason] = self.wasted.get(reason, 0) + wasted
            self.metrics.wasted.labels(reason).inc(wasted)
        self._update_in_flight()

    def _expire_parked(self) -> None:
        now = time.monotonic()
        for p, state in list(self.parked.items()):
            if state.parked_until is not None and now >= state.parked_until:
                del self.parked[p]
                self._drop_state(state, "moved")

    # -- fetching and generating ----------------------------------------------

    @property
    def in_flight(self) -> int:
        return (sum(len(s.tasks) for s in self.states.values())
                + sum(len(s.tasks) for s in self.parked.values()))

    def _update_in_flight(self) -> None:
        self.metrics.in_flight.set(self.in_flight)

    def _buffered(self) -> int:
        return sum(len(s.queue) for s in self.states.values())

    def _apply_pause(self) -> None:
        assert self._members is not None
        want = self._pause.want(buffered=self._buffered(), limit=self.limit,
                                paused=self._members.paused, stopping=self.stopping,
                                server_up=(self._gate.is_open if self._gate else True)
                                and self.breaker.state == "closed",
                                now=time.monotonic())
        self._members.apply_pause(want)

    def _poll(self) -> None:
        assert self._members is not None
        room = self.limit - self._buffered()
        if room <= 0 and not self._members.paused:
            # Leave the records in librdkafka's queue for now: the pause policy
            # pauses the partitions long before max.poll.interval.ms.
            return
        for slot_name, message in self._members.poll(max(1, min(room, 1000))):
            self._accept(message, slot_name)

    def _accept(self, message: Message, slot_name: str) -> None:
        partition = message.partition() or 0
        topic = message.topic() or self.prompts_topic
        state = self.states.get((topic, partition))
        if state is None or state.slot != slot_name:
            # a late message of a partition this slot no longer holds: taking
            # it into another slot's state would interleave two fetch streams
            # and let a commit pass over records never tracked
            return
        offset = message.offset() or 0
        if state.last_fetched is not None and offset <= state.last_fetched:
            return  # already have it (a resumed partition's refetch)
        state.watermark.track(offset)
        state.last_fetched = offset
        found: Input | str = (check_turn(message.value(), self.spec) if topic == self.turns_topic
                              else check_prompt(message.value(), self._topic_owner))
        if isinstance(found, str):
            what = "turn" if topic == self.turns_topic else "prompt"
            log.warning(f"invalid {what} record; dead-lettered", partition=partition,
                        offset=offset, problem=found)
            state.watermark.finish(offset, invalid_record(
                self.spec, topic=topic, partition=partition, offset=offset,
                key=message.key(), value=message.value(), problem=found,
                instance=self.config.instance))
            self._wake.set()
            return
        state.queue.append((offset, found))

    def _start_tasks(self) -> None:
        if self.stopping or (self._gate is not None and not self._gate.is_open):
            return
        loop = asyncio.get_running_loop()
        in_flight = self.in_flight
        while in_flight < self.limit:
            started = False
            for state in list(self.states.values()):
                if in_flight >= self.limit:
                    break
                if not state.queue or state.slot in self._handovers:
                    continue
                offset, prompt = state.queue.popleft()
                state.tasks[offset] = loop.create_task(self._generate(state, offset, prompt))
                in_flight += 1
                started = True
            if not started:
                break
        self.metrics.in_flight.set(in_flight)

    async def _generate(self, state: PartitionState, offset: int, item: Input) -> None:
        assert self._generator is not None
        at = position_of(item) if self.turns_topic else None
        try:
            outcome: Outcome = await self._generator.generate(
                at.request() if at is not None else item)  # type: ignore[arg-type]
        except asyncio.CancelledError:
            return  # revoked, lost or moved: the state was dropped already
        except ServerRefuses as exc:
            self._fail_fatally(FatalWorkerError(str(exc)))
            return
        p = state.key
        if self.states.get(p) is not state and self.parked.get(p) is not state:
            return  # dropped while finishing
        state.tasks.pop(offset, None)
        state.retries += outcome.retries
        record: Output = outcome.record
        if at is not None:
            assert not isinstance(record, Conversation)
            record = advance(at, record, dataset_answerer(at.prompt, self._tool_hook))
        state.watermark.finish(offset, record)
        self._wake.set()

    def _observe_latency(self, seconds: float) -> None:
        self.metrics.latency.observe(seconds)
        self.latency_s = seconds if not self.latency_s else 0.9 * self.latency_s + 0.1 * seconds

    def _fail_fatally(self, error: BaseException) -> None:
        if self.fatal is None:
            self.fatal = error
            log.error("stopping", error=str(error))
        self.stopping = True
        self._wake.set()

    # -- committing -------------------------------------------------------------

    def _commit_due(self) -> bool:
        if time.monotonic() - self._last_commit >= self.config.commit_interval_s:
            return True
        ready = sum(s.watermark.ready_count() for s in self.states.values())
        # Nothing in flight: no result is coming to share the transaction
        # (the end of a run or of this worker's partitions), so commit now.
        return ready >= self.config.commit_max_records or (ready > 0 and not self.in_flight)

    def _commit(self, only: set[Key] | None = None) -> int:
        """One transaction: ready results + counters + input offsets (each
        slot's with its own group metadata). Returns the records committed;
        results stay in the watermarks until the commit succeeded."""
        assert self._txns is not None and self._members is not None
        self._last_commit = time.monotonic()
        if self.fatal is not None:
            return 0
        ready: list[tuple[PartitionState, list[Output], int]] = []
        for p, state in self.states.items():
            if only is not None and p not in only:
                continue
            records, next_offset = state.watermark.peek_ready(self.config.commit_max_records)
            if records and next_offset is not None:
                ready.append((state, records, next_offset))
        heartbeat = (time.monotonic() - self._last_committed >= self.config.heartbeat_s
                     or self._final_commit)
        if not ready and (only is not None or not heartbeat):
            return 0
        by_slot: dict[str, dict[Key, int]] = {}
        for state, _, next_offset in ready:
            by_slot.setdefault(state.slot, {})[state.key] = next_offset
        slots = self._members.slots
        all_records = [r for _, records, _ in ready for r in records]
        now = time.time()
        counted = counters.add_records(self._progress, all_records,
                                       sum(state.retries for state, _, _ in ready), now=now)
        totals = (counted.completions + counted.failures, counted.completion_tokens)
        recent = self._recent.rates(now, *totals)
        new_progress = msgspec.structs.replace(
            counted, concurrency_limit=self.limit, in_flight=self.in_flight,
            breaker=(self.breaker.cause or "") if self.breaker.state != "closed" else "",
            server=self.server, heartbeat_s=self.config.heartbeat_s,
            last_work_at=now if all_records else counted.last_work_at,
            stopped_at=now if self._final_commit else 0.0,
            partitions=len(self.states), recent_requests_per_s=recent.requests_per_s,
            recent_tokens_per_s=recent.tokens_per_s, recent_window_s=recent.window_s)
        started = time.monotonic()
        try:
            with self._txns.transaction(lambda: [
                    slots[name].group_offsets(offsets)
                    for name, offsets in by_slot.items() if name in slots]) as txn:
                for state, records, _ in ready:
                    for record in records:
                        topic = (self.turns_topic if isinstance(record, TurnRecord)
                                 else self.completions_topic)
                        txn.produce(topic, encode_record(record),  # type: ignore[arg-type]
                                    key=record.id.encode(), partition=state.partition)
                txn.produce(topics.progress_topic(self.run_id), msgspec.json.encode(new_progress),
                            key=self.progress_key.encode())
        except TransactionAborted as exc:
            self.metrics.commits.labels("aborted").inc()
            log.warning("transaction aborted; results stay queued for the next commit",
                        error=str(exc))
            return 0
        except KafkaFatal as exc:
            self.metrics.commits.labels("aborted").inc()
            self._fail_fatally(exc)
            return 0
        for state, records, next_offset in ready:
            state.watermark.take(len(records))
            state.retries = 0
            state.committed = next_offset
            self.metrics.committed_offset.labels(str(self._label(state.key))).set(next_offset)
        self._progress = new_progress
        self._recent.add(now, *totals)
        self._last_committed = time.monotonic()
        self.metrics.commits.labels("committed").inc()
        self.metrics.commit_seconds.observe(time.monotonic() - started)
        self._observe(all_records)
        self._observe_backlog()
        return len(all_records)

    def _observe_backlog(self) -> None:
        """Lag per owned partition (the high watermark cached by the fetcher:
        no broker call) and results waiting behind an unfinished offset."""
        assert self._members is not None
        waiting = 0
        for p, state in self.states.items():
            waiting += state.watermark.waiting
            slot = self._members.slots.get(state.slot)
            committed = state.committed_offset()
            if slot is None or committed is None:
                continue
            try:
                _low, high = slot.consumer.get_watermark_offsets(
                    TopicPartition(state.topic, state.partition), cached=True)
            except Exception as exc:  # noqa: BLE001 - a metric must never stop the worker
                log.debug("lag of a partition unknown; gauge not updated", partition=p,
                          error=str(exc))
                continue
            if high is not None and high >= 0:
                self.metrics.lag.labels(str(self._label(state.key))).set(max(0, high - committed))
        self.metrics.waiting.set(waiting)

    def _observe(self, records: list[Output]) -> None:
        accept_sum = 0.0
        accept_n = 0
        for record in records:
            if isinstance(record, (TurnRecord, Conversation)):
                continue  # counted as turns in the progress record
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

    async def _fleet(self) -> None:
        """Watch the group; open and close this worker's slots (KIP-848), or
        repair partitions no member owns (classic)."""
        assert self._members is not None
        admin = clients.admin(self.settings)
        offsets = clients.consumer(self.settings, self.group)  # never subscribes
        stranded = groups.StrandedWatch(f"{self.config.instance}#",
                                        grace_s=3 * self.config.fleet_interval_s)
        try:
            await self._watch_fleet(admin, offsets, stranded)
        finally:
            offsets.close()

    async def _watch_fleet(self, admin: Any, offsets: Any, stranded: groups.StrandedWatch
                           ) -> None:
        assert self._members is not None
        while not self.stopping:
            await asyncio.sleep(self.config.fleet_interval_s)
            try:
                view, state = await asyncio.to_thread(
                    read_view, admin, offsets, group=self.group, topic=self.prompts_topic,
                    partitions=self.spec.partitions,
                    timeout_s=max(5.0, self.settings.connect_timeout_s))
            except ViewUnavailable as exc:
                log.debug("fleet view unavailable", error=str(exc))
                continue
            if self.stopping:
                return
            others = sorted({m.worker for m in view.members} - {self.config.instance})
            if bool(others) != self.others_seen:
                log.info("fleet: other workers in the group" if others
                         else "fleet: alone in the group", workers=others)
            self.others_seen = bool(others)
            self._rates.observe(view)
            if self.config.group_protocol == "classic":
                if stranded.check(state, self.spec.partitions):
                    for name in list(self._members.slots):
                        self._members.rejoin(name)
                continue
            # The fleet view sees the prompts topic only: with a regenerate-turns
            # run's turns it would close slots as "no work left" while turns
            # flow, so such runs keep one slot and the group's assignor.
            if self.config.fleet_balancing and self.turns_topic is None:
                workers = frozenset(view.workers())
                settled = workers == self._last_workers
                self._last_workers = workers
                self._balance(view, settled)

    def _balance(self, view: FleetView, settled: bool) -> None:
        assert self._members is not None
        if self._handovers:
            return  # one move at a time: the view still shows the draining slot
        decision = decide(view, self._rates.rates_for(view.workers() | {self.config.instance}),
                          self.config.instance,
                          my_latency_s=self.latency_s, settled=settled)
        # The view may predate a slot this worker closed since.
        decision = msgspec.structs.replace(
            decision, close=tuple(n for n in decision.close if n in self._members.slots))
        if decision.open or decision.close:
            log.info("fleet: adjusting slots", open=decision.open, close=list(decision.close),
                     why=decision.why)
        for _ in range(decision.open):
            self._members.open()
        now = time.monotonic()
        for name in decision.close:  # all open: filtered above
            if self._members.slots[name].partitions:
                # A donation: drain first (no new requests there), close after.
                self._handovers.start(name, now, drain_limit_s(self.latency_s))
            else:
                # Even its last one: a standby opened now would compete with
                # the receiver's for the freed partition; it rejoins next round.
                self._members.close(name)
        self._close_drained()
        self.metrics.slots.set(len(self._members.slots))

    def _close_drained(self) -> None:
        """Close the donating slots whose requests have all finished (their
        results are committed by the revoke) or whose drain limit passed."""
        if not self._handovers or self._members is None:
            return
        def in_flight(name: str) -> int:
            return sum(len(s.tasks) for s in self.states.values() if s.slot == name)
        for name, drained in self._handovers.due(time.monotonic(), in_flight):
            if name in self._members.slots:
                log.info("fleet: handing a partition over", slot=name, drained=drained)
                self._members.close(name)
        self.metrics.slots.set(len(self._members.slots))

    async def _watch_server(self) -> None:
        """Read the server's /metrics (every second with --concurrency auto,
        else every 5 s): the auto controller's input, and the snapshot every
        commit carries for `tokenmill status`."""
        assert self._client is not None
        auto = self.config.concurrency is None
        bounds = AutoBounds(maximum=self.config.max_concurrency)
        interval = self.config.auto_interval_s if auto else 5.0
        server_max = await self._client.max_running_requests()
        warned = False
        while not self.stopping:
            await asyncio.sleep(interval)
            text = await self._client.metrics_text()
            load = parse_metrics(text) if text else None
            if load is None:
                if auto and not warned:
                    log.warning("no SGLang metrics at /metrics (start SGLang with "
                                "--enable-metrics); keeping the in-flight limit", limit=self.limit)
                    warned = True
                continue
            self.server = ServerSnapshot(
                running=load.running, queued=load.queued, token_usage=load.token_usage,
                gen_throughput=load.gen_throughput, accept_length=load.accept_length,
                max_running_requests=server_max, at=time.time())
            if not auto:
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
            try:
                state = await asyncio.to_thread(progress.try_read_run_progress, self.settings,
                                                self.run_id)
            except progress.ProgressUnavailable as exc:
                log.warning("run progress unavailable; checking again later", error=str(exc))
                continue
            if state.generation_done:
                log.info("run fully generated; stopping", published=state.published,
                         generated=state.generated)
                self.run_done = True
                self.request_stop()
                return

    def request_stop(self) -> None:
        if not self.stopping:
            log.info("stopping", in_flight=self.in_flight, hand_over=self._hands_over())
        self.stopping = True
        self._wake.set()

    def _hands_over(self) -> bool:
        """With other workers in the group, a stopping worker gives its
        partitions up at once (its requests in flight are redone there);
        alone, it drains them first."""
        return self.others_seen and self.config.group_protocol == "consumer"

    async def _check_server(self, client: SGLangClient) -> None:
        """What can be known up front: a context length that leaves no room for
        a prompt fails every request, so refuse to start (one line)."""
        context = await client.context_length()
        max_tokens = self.spec.generation.max_tokens
        if context is not None and max_tokens >= context:
            raise FatalWorkerError(
                f"run {self.run_id} asks for max_tokens {max_tokens}, but the server at "
                f"{self.config.sglang_url} has a context length of {context}: no prompt would "
                "fit. Start SGLang with a larger --context-length, or use a run with a smaller "
                "--max-tokens")

    def _on_breaker(self, state: str, cause: str | None) -> None:
        self.metrics.breaker_open.set(1 if state == "open" else 0)
        self._last_committed = 0.0  # the next commit round records it (a heartbeat)
        self._wake.set()

    def _on_server_change(self, healthy: bool) -> None:
        self.metrics.server_up.set(1 if healthy else 0)
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
            await self._check_server(client)
            self._generator = Generator(
                client=client, gate=self._gate, spec=self.spec, instance=self.config.instance,
                retry=self.config.retry, breaker=self.breaker,
                on_retry=lambda kind: self.metrics.retries.labels(kind).inc(),
                on_latency=self._observe_latency, on_breaker=self._on_breaker)
            if self.config.concurrency is None:
                await self._initial_auto_limit()
            self._background.append(loop.create_task(self._watch_server()))
            if self.config.until_done:
                self._background.append(loop.create_task(self._done_watch()))
            self._background.append(loop.create_task(self._fleet()))
            log.info("consuming", run=self.run_id, instance=self.config.instance,
                     topic=self.prompts_topic, server=self.config.sglang_url,
                     group_protocol=self.config.group_protocol,
                     concurrency=self.config.concurrency or f"auto (start {self.limit})")
            try:
                await self._loop()
                await self._finish()
            finally:
                for task in self._background:
                    task.cancel()
                self._gate.close()

    async def _loop(self) -> None:
        while not self.stopping:
            self.watchdog.beat()
            self._poll()
            self._apply_pause()
            self._start_tasks()
            self._expire_parked()
            if self._commit_due():
                self._commit()
            self._close_drained()
            await self._idle(0.05)

    async def _idle(self, seconds: float) -> None:
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    async def _finish(self) -> None:
        """Stopping: hand over at once, or drain (bounded) when alone."""
        assert self._members is not None
        if self.fatal is not None:
            return
        self._apply_pause()
        if not self._hands_over():
            deadline = time.monotonic() + self.config.drain_timeout_s
            while self.in_flight > 0 and time.monotonic() < deadline and self.fatal is None:
                self.watchdog.beat()
                self._poll()  # keeps the group membership alive
                self._apply_pause()
                self._expire_parked()
                if self._commit_due():
                    self._commit()
                await self._idle(0.1)
            if self.in_flight:
                log.warning("drain timeout: abandoning in-flight requests",
                            in_flight=self.in_flight)
        self._final_commit = True
        self._commit()
        if self.run_done:
            return  # nothing left for anyone: no need to hand partitions over
        # Leaving the group revokes every partition: the revoke commits what
        # is ready and drops the rest (counted as wasted).
        self._members.close_all()
        for p, state in list(self.parked.items()):
            del self.parked[p]
            self._drop_state(state, "shutdown")

    def _shutdown(self) -> None:
        """Never raises: a second error must not hide the first. After a fatal
        error nothing is closed: the broker may not answer, and the members'
        sessions expire by themselves (crash-only)."""
        if self.fatal is not None:
            return
        try:
            if self._members is not None and not self.run_done:
                self._members.close_all()
            if self._producer is not None:
                with self.watchdog.guard("flushing the producer", 30):
                    self._producer.flush(10)
        except Exception as exc:  # noqa: BLE001 - logged; the exit code says the rest
            log.warning("shutting down", error=str(exc))
        log.info("stopped", instance=self.config.instance,
                 committed=self._progress.completions + self._progress.failures,
                 wasted=self.wasted)
