"""Whether each slot's Kafka client still fetches the partitions it holds
(the rule: tokenmill/kafka/fetch_stall.py).

A partition is heard of when a record of it is polled. It is not expected
to be heard of while the worker does not fetch on purpose (paused: the
server down, stopping, the buffer full), so those turns hush every clock.
Every half limit (at most every 10 s: `fetch_stall.look_interval`),
partitions silent past the limit are looked up on the broker (in a
thread: the event loop never waits on it), and a partition found stalled
at two looks in a row ends the worker with one line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from confluent_kafka import TopicPartition

from tokenmill.kafka import fetch_stall
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")

Held = tuple[str, str, int]  # (slot, topic, partition)


class FetchWatch:
    """Parameters: `limit_s` (--fetch-stall), `admin` (makes the client the
    lookups use), `clock` (monotonic seconds)."""

    def __init__(self, *, limit_s: float, admin: Callable[[], object],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.silence: fetch_stall.Silence[Held] = fetch_stall.Silence(limit_s=limit_s)
        self._admin = admin
        self._clock = clock

    def assigned(self, slot: str, partitions: Iterable[TopicPartition],
                 starts: dict[tuple[str, int], int | None]) -> None:
        """`starts`: where each partition is read from (None: not known)."""
        now = self._clock()
        for tp in partitions:
            key = (slot, tp.topic, tp.partition)
            self.silence.owned([key], now)
            start = tp.offset if tp.offset >= 0 else starts.get((tp.topic, tp.partition))
            if start is not None:
                self.silence.restarted(key, start, now)

    def gone(self, slot: str, partitions: Iterable[TopicPartition]) -> None:
        self.silence.dropped((slot, tp.topic, tp.partition) for tp in partitions)

    def heard(self, slot: str, topic: str, partition: int, offset: int) -> None:
        self.silence.record((slot, topic, partition), offset, self._clock())

    def polled(self, fetching: bool) -> None:
        """One poll turn; `fetching` False: not fetching on purpose."""
        if fetching:
            self.silence.polled()
        else:
            self.silence.hush(self._clock())

    async def run(self, stopping: Callable[[], bool],
                  on_stall: Callable[[BaseException], None]) -> None:
        while not stopping():
            await asyncio.sleep(fetch_stall.look_interval(self.silence.limit_s))
            verdict = await self._look()
            if verdict is not None:
                on_stall(verdict)
                return

    async def _look(self) -> fetch_stall.FetchStalled | None:
        now = self._clock()
        silent = self.silence.silent(now)
        if not silent:
            self.silence.confirm({})
            return None
        wanted = sorted({(topic, partition) for _slot, topic, partition in silent})
        try:
            ends = await asyncio.to_thread(fetch_stall.committed_ends, self._admin(), wanted)
        except Exception as exc:  # noqa: BLE001 - a broker down: no verdict, look again later
            log.debug("could not ask the broker about silent partitions", error=str(exc))
            return None
        verdict = self.silence.confirm(fetch_stall.stalled(
            silent, {key: ends[key[1:]] for key in silent if key[1:] in ends}, {}))
        if not verdict:
            return None
        silent_s = min(self.silence.silent_for(key, now) for key in verdict)
        topics = ", ".join(sorted({topic for _slot, topic, _p in verdict}))
        named = {f"{slot} {topic.rsplit('.', 1)[-1]}-{p}": v
                 for (slot, topic, p), v in verdict.items()}
        return fetch_stall.FetchStalled(fetch_stall.describe(topics, named, silent_s))
