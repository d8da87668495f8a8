"""The loop's periodic looks outside this instance: is the run persisted
(`--until-done`), how far behind each owned partition is (the lag
gauge), and whether a silent partition has records waiting (the client
stopped fetching it: tokenmill/kafka/fetch_stall.py). The reads are the
shared ones the worker uses too (tokenmill/run_done.py,
tokenmill/kafka/lag.py); what the sink makes of them is here. The
classic protocol's stranded repair is tokenmill/kafka/stranded.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sink.metrics import SinkMetrics
from sink.ownership import Ownership
from tokenmill import run_done
from tokenmill.kafka import fetch_stall, lag
from tokenmill.log import get_logger
from tokenmill.progress import ProgressTail

log = get_logger("tokenmill.sink")


def check_done(progress: ProgressTail, ownership: Ownership, flush: Callable[[], None]) -> bool:
    """True when every prompt of the run is persisted (by all instances).
    When nothing more can arrive, seal the open batches now instead of
    waiting for their age, and `flush` (start a round: never wait here, a
    stalled S3 must not stop heartbeats)."""
    state = run_done.look(progress)
    if state is None:
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
        for partition, behind in lag.position_lags(consumer, topic, owned).items():
            metrics.lag.labels(str(partition)).set(behind)
    except Exception as exc:  # noqa: BLE001 - metrics must never stop the sink
        log.debug("lag update failed", error=str(exc))


def check_fetching(silence: fetch_stall.Silence[int], admin: Callable[[], Any], topic: str,
                   group: str, now: float) -> None:
    """Raise FetchStalled when a partition silent for the limit has committed
    records past where the consumer would read, at two checks in a row. Asks
    the broker only about silent partitions; when it cannot answer, judges
    nothing this time."""
    silent = silence.silent(now)
    if not silent:
        silence.confirm({})
        return
    wanted = [(topic, p) for p in silent]
    try:
        client = admin()
        ends = fetch_stall.committed_ends(client, wanted)
        committed = (fetch_stall.group_committed(client, group, wanted)
                     if any(offset is None for offset in silent.values()) else {})
    except Exception as exc:  # noqa: BLE001 - a broker down: no verdict, look again later
        log.debug("could not ask the broker about silent partitions", error=str(exc))
        return
    verdict = silence.confirm(fetch_stall.stalled(
        silent, {p: end for (_t, p), end in ends.items()},
        {p: offset for (_t, p), offset in committed.items()}))
    if verdict:
        silent_s = min(silence.silent_for(p, now) for p in verdict)
        raise fetch_stall.FetchStalled(fetch_stall.describe(topic, verdict, silent_s))
