"""Fetching: how much to poll, when to pause, and what each fetched record
becomes.

Polling never blocks and takes at most what fits under the in-flight limit;
the pause policy (consumer/pause.py) pauses every slot's partitions when the
server is down, when stopping, or when the buffer stayed full. A record is
taken only into the state its own slot holds (consumer/ownership.py) and
only above the last offset fetched there; every record is untrusted: an
invalid one becomes its own failure record (dead-lettered by the sink as
`invalid`), finished at once so its offset is committed like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Message

from consumer.fetch_watch import FetchWatch
from consumer.membership import Membership
from consumer.ownership import Ownership
from consumer.pause import PausePolicy
from consumer.turn_chain import TurnChain
from consumer.validation import invalid_record
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")


class Intake:
    """Parameters: `ownership`, `chain` (how records of each topic are
    read), `instance` (stamped on invalid-record failures), `wake` (a result
    is ready to commit), `fetch_watch` (told what each poll brought)."""

    def __init__(self, *, ownership: Ownership, chain: TurnChain, instance: str,
                 wake: Callable[[], None], fetch_watch: FetchWatch) -> None:
        self.ownership = ownership
        self.chain = chain
        self.instance = instance
        self._wake = wake
        self._fetch_watch = fetch_watch
        self._pause = PausePolicy()

    def poll(self, members: Membership, limit: int) -> None:
        room = limit - self.ownership.buffered()
        if room <= 0 and not members.paused:
            # Leave the records in librdkafka's queue for now: the pause policy
            # pauses the partitions long before max.poll.interval.ms.
            self._fetch_watch.polled(fetching=False)
            return
        for slot, message in members.poll(max(1, min(room, 1000))):
            self.accept(message, slot)
        self._fetch_watch.polled(fetching=not members.paused)

    def apply_pause(self, members: Membership, *, limit: int, stopping: bool,
                    server_up: bool) -> None:
        members.apply_pause(self._pause.want(
            buffered=self.ownership.buffered(), limit=limit, paused=members.paused,
            stopping=stopping, server_up=server_up, now=time.monotonic()))

    def accept(self, message: Message, slot: str) -> None:
        topic = message.topic() or self.chain.prompts_topic
        partition = message.partition() or 0
        offset = message.offset() or 0
        self._fetch_watch.heard(slot, topic, partition, offset)
        state = self.ownership.state(slot, (topic, partition))
        if state is None:
            # a late message of a partition this slot no longer holds: taking
            # it into another slot's state would interleave two fetch streams
            # and let a commit pass over records never tracked
            return
        if state.last_fetched is not None and offset <= state.last_fetched:
            return  # already have it (a resumed partition's refetch)
        state.watermark.track(offset)
        state.last_fetched = offset
        found = self.chain.check(topic, message.value())
        if isinstance(found, str):
            log.warning(f"invalid {self.chain.what(topic)} record; dead-lettered",
                        partition=partition, offset=offset, problem=found)
            state.watermark.finish(offset, invalid_record(
                self.chain.spec, topic=topic, partition=partition, offset=offset,
                key=message.key(), value=message.value(), problem=found,
                instance=self.instance))
            self._wake()
            return
        state.queue.append((offset, found))
