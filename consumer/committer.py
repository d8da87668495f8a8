"""The worker's commits: when one is due, and what one changes.

Every `commit_interval_s` (sooner when `commit_max_records` results are
ready, or when results are ready and nothing is in flight to join them)
the ready results of every held partition commit in one transaction with
their input offsets and the worker's progress record (consumer/
checkpoint.py). An idle worker still commits its progress record every
`heartbeat_s`: `status` sees it alive, and a duplicate --instance that
fenced it is noticed. After a commit: the counters move on, and the
metrics and lag gauges follow.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from consumer.checkpoint import Checkpoint, Vitals, commit, ready_batches
from consumer.config import WorkerConfig
from consumer.membership import Membership
from consumer.metrics import ConsumerMetrics
from consumer.ownership import Ownership
from consumer.partitions import Output, PartitionState
from consumer.recent_rate import RecentRate
from consumer.turn_chain import TurnChain
from schemas import Conversation, Failure
from schemas.progress import ConsumerProgress, consumer_key, decode_progress
from schemas.turn import TurnRecord
from tokenmill.kafka import lag, topics
from tokenmill.kafka.transactions import KafkaFatal, TransactionAborted, Transactions
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")


class Committer:
    """Parameters: `run_id`, `config`, `ownership` (what is ready), `members`
    (each slot's group metadata and fetch positions), `chain` (where records
    go), `metrics`, `vitals` (the worker now, for the progress record),
    `on_fatal` (the producer is fenced or broken)."""

    def __init__(self, *, run_id: str, config: WorkerConfig, ownership: Ownership,
                 members: Membership, chain: TurnChain, metrics: ConsumerMetrics,
                 vitals: Callable[[], Vitals], on_fatal: Callable[[BaseException], None]) -> None:
        self.config = config
        self.ownership = ownership
        self.members = members
        self.chain = chain
        self.metrics = metrics
        self._vitals = vitals
        self._on_fatal = on_fatal
        self.progress_key = consumer_key(run_id, config.instance)
        self.progress_topic = topics.progress_topic(run_id)
        self.progress = ConsumerProgress(run=run_id, instance=config.instance)
        self._recent = RecentRate()
        self._transactions: Transactions | None = None
        self._last_commit = time.monotonic()
        self._last_committed = time.monotonic()
        # The last commit of a clean exit marks the instance stopped (not dead).
        self.final = False

    @property
    def committed(self) -> int:
        """Records this instance committed, over its lifetime."""
        return self.progress.completions + self.progress.failures

    def start(self, transactions: Transactions, previous: bytes | None) -> None:
        """Commit through `transactions`, counting on from this instance's
        last committed progress record (`previous`, raw)."""
        self._transactions = transactions
        if previous is not None:
            record = decode_progress(previous)
            if isinstance(record, ConsumerProgress):
                self.progress = record
        if not self.progress.started_at:
            self.progress = msgspec.structs.replace(self.progress, started_at=time.time())
        self.progress = msgspec.structs.replace(self.progress, stopped_at=0.0)
        self._recent.add(time.time(), self.committed, self.progress.completion_tokens)

    def heartbeat_soon(self) -> None:
        """Let the next commit round record the progress even without results."""
        self._last_committed = 0.0

    def due(self) -> bool:
        if time.monotonic() - self._last_commit >= self.config.commit_interval_s:
            return True
        ready = self.ownership.ready()
        # Nothing in flight: no result is coming to share the transaction
        # (the end of a run or of this worker's partitions), so commit now.
        return ready >= self.config.commit_max_records or (
            ready > 0 and not self.ownership.in_flight)

    def commit(self, only: Sequence[PartitionState] | None = None) -> int:
        """One transaction: ready results + counters + input offsets (of
        `only`, a revoke's partitions, or of every held one). Returns the
        records committed; results stay in the watermarks unless committed."""
        self._last_commit = time.monotonic()
        states = self.ownership.states() if only is None else only
        batches = ready_batches(states, self.config.commit_max_records)
        heartbeat = (time.monotonic() - self._last_committed >= self.config.heartbeat_s
                     or self.final)
        if not batches and (only is not None or not heartbeat):
            return 0
        assert self._transactions is not None, "start() first"
        checkpoint = Checkpoint.of(batches, progress=self.progress, recent=self._recent,
                                   vitals=self._vitals(), heartbeat_s=self.config.heartbeat_s,
                                   final=self.final, now=time.time())
        started = time.monotonic()
        try:
            commit(checkpoint, self._transactions, group_offsets=self.members.group_offsets,
                   topic_of=self.chain.topic_of, progress_topic=self.progress_topic,
                   progress_key=self.progress_key)
        except TransactionAborted as exc:
            self.metrics.commits.labels("aborted").inc()
            log.warning("transaction aborted; results stay queued for the next commit",
                        error=str(exc))
            return 0
        except KafkaFatal as exc:
            self.metrics.commits.labels("aborted").inc()
            self._on_fatal(exc)
            return 0
        checkpoint.settle()
        self._settled(checkpoint, started)
        return len(checkpoint.records)

    def _settled(self, checkpoint: Checkpoint, started: float) -> None:
        for batch in checkpoint.batches:
            self.metrics.committed_offset.labels(
                str(self.ownership.label(batch.state.key))).set(batch.next_offset)
        self.progress = checkpoint.progress
        self._recent.add(checkpoint.at, *checkpoint.totals)
        self._last_committed = time.monotonic()
        self.metrics.commits.labels("committed").inc()
        self.metrics.commit_seconds.observe(time.monotonic() - started)
        observe_records(self.metrics, checkpoint.records)
        self._observe_backlog()

    def _observe_backlog(self) -> None:
        """Lag per held partition (tokenmill/kafka/lag.py: no broker call)
        and results waiting behind an unfinished offset."""
        waiting = 0
        for state in self.ownership.states():
            waiting += state.watermark.waiting
            slot = self.members.slots.get(state.slot)
            committed = state.committed_offset()
            if slot is None or committed is None:
                continue
            try:
                behind = lag.behind(slot.consumer, state.topic, state.partition, committed)
            except Exception as exc:  # noqa: BLE001 - a metric must never stop the worker
                log.debug("lag of a partition unknown; gauge not updated", partition=state.key,
                          error=str(exc))
                continue
            if behind is not None:
                self.metrics.lag.labels(str(self.ownership.label(state.key))).set(behind)
        self.metrics.waiting.set(waiting)


def observe_records(metrics: ConsumerMetrics, records: list[Output]) -> None:
    """The committed records' counts, tokens and accept length, as metrics."""
    accept_sum = 0.0
    accept_n = 0
    for record in records:
        if isinstance(record, (TurnRecord, Conversation)):
            continue  # counted as turns in the progress record
        if isinstance(record, Failure):
            metrics.failures.labels(record.failure).inc()
            continue
        metrics.completions.labels(record.finish_reason).inc()
        metrics.prompt_tokens.inc(record.usage.prompt_tokens)
        metrics.completion_tokens.inc(record.usage.completion_tokens)
        if record.spec.accept_length is not None:
            accept_sum += record.spec.accept_length
            accept_n += 1
    if accept_n:
        metrics.accept_length.set(accept_sum / accept_n)
