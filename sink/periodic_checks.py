"""The loop's periodic looks outside this instance: is the run persisted
(`--until-done`), how far behind each owned partition is (the lag gauge),
and are partitions stranded (classic protocol). Each has a twin in the
worker; both move to shared plumbing in tokenmill/ (run_done, kafka/lag,
kafka/stranded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from sink.metrics import SinkMetrics
from sink.ownership import Ownership
from tokenmill import progress as run_progress
from tokenmill.kafka import clients, groups, topics
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.sink")


def check_done(settings: Settings, run: str, ownership: Ownership,
               flush: Callable[[], None]) -> bool:
    """True when every prompt of the run is persisted (by all instances).
    When nothing more can arrive, seal the open batches now instead of
    waiting for their age, and `flush` (start a round: never wait here, a
    stalled S3 must not stop heartbeats)."""
    try:
        state = run_progress.try_read_run_progress(settings, run)
    except run_progress.ProgressUnavailable as exc:
        log.warning("run progress unavailable; checking again later", error=str(exc))
        return False
    if state.sink_done:
        log.info("run persisted", published=state.published, persisted=state.persisted)
        return True
    if not state.publishing_done or not ownership.all_at_end():
        return False
    pending = ownership.pending_records
    if state.generation_done or state.persisted + pending >= state.published:
        drained = ownership.drain()
        if drained:
            log.info("nothing more to come: flushing open batches", partitions=drained)
            flush()
    return False


def update_lag(consumer: Any, topic: str, partitions: Iterable[int],
               metrics: SinkMetrics) -> None:
    """High watermark minus position, per partition (cached watermarks)."""
    owned = list(partitions)
    if not owned:
        return
    try:
        positions = consumer.position([TopicPartition(topic, p) for p in owned])
        for tp in positions:
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            if tp.offset >= 0 and high >= 0:
                metrics.lag.labels(str(tp.partition)).set(max(0, high - tp.offset))
    except Exception as exc:  # noqa: BLE001 - metrics must never stop the sink
        log.debug("lag update failed", error=str(exc))


class StrandedRepair:
    """Classic protocol: partitions owned by no member of a stable group
    are taken back by one member rejoining (tokenmill/kafka/groups.py).

    Parameters: `settings`, `run`, `instance`, `topic` (the completions
    topic) and its number of `partitions`, `rejoin` (leave the group and
    join it again)."""

    def __init__(self, *, settings: Settings, run: str, instance: str, topic: str,
                 partitions: int, rejoin: Callable[[], None]) -> None:
        self._settings = settings
        self._run = run
        self._topic = topic
        self._partitions = partitions
        self._rejoin = rejoin
        self._watch = groups.StrandedWatch(f"{instance}#", grace_s=10.0)

    def check(self) -> None:
        try:
            state = groups.describe(clients.admin(self._settings), topics.sink_group(self._run),
                                    self._topic, 5.0)
        except KafkaException as exc:
            log.debug("group description unavailable", error=str(exc))
            return
        if self._watch.check(state, self._partitions):
            self._rejoin()
