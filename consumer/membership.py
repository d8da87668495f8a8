"""A worker's members of the run's consumer group ("slots").

Each slot is one Kafka consumer (client id `<worker>#<n>`) in the group
`tokenmill.<run>.generate`. With KIP-848 (the default) a slot owns at most
one partition once the worker has split (consumer/fleet.py), so opening and
closing slots is how a worker grows and shrinks its share. With the classic
protocol a worker runs one slot and the share is whatever the assignor
gives it.

Every call here runs on the worker's event-loop thread (confluent-kafka
serializes consumer calls anyway); blocking ones are bounded by the
watchdog. Rebalance callbacks are forwarded to the worker with the slot
they concern, and the worker's wanted pause state is applied to every
newly assigned partition, so a pause flag can never survive a
lost -> assign cycle unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from consumer.fleet import slot_name
from tokenmill import crashpoints
from tokenmill.kafka import clients, groups, start_offsets
from tokenmill.kafka.transactions import GroupOffsets, KafkaFatal
from tokenmill.log import get_logger
from tokenmill.settings import Settings
from tokenmill.watchdog import Watchdog

log = get_logger("tokenmill.consumer.membership")

Callback = Callable[["Slot", list[TopicPartition]], None]
CLOSE_LIMIT_S = 60.0


@dataclass
class Slot:
    name: str
    consumer: Consumer
    partitions: set[int] = field(default_factory=set)
    closing: bool = False  # inside close(): what it is given now leaves with it

    def group_offsets(self, offsets: Mapping[tuple[str, int], int]) -> GroupOffsets:
        """Next offsets by (topic, partition), sent with this member's metadata."""
        return GroupOffsets([TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())],
                            self.consumer.consumer_group_metadata)


# What a slot's consumer fetches ahead. A worker takes at most its in-flight
# limit of prompts at a time, but librdkafka's defaults (100,000 messages per
# partition queued, bounded only by the 16 MiB a queue was given, plus the
# 8 MiB per-partition fetch the other consumers use for the largest
# records) grew one worker holding the 28 partitions of a seed-size run to
# 593 MiB resident, kept for the rest of the run (the seed run's benchmark:
# workers ended at 0.3-0.8 GiB). With these, the same worker stays at
# 165 MiB (the experiment in issue 27's note); 1 MiB is still about 800
# seed prompts, refilled by a fetch in milliseconds, and a record larger
# than a fetch is returned whole anyway (the broker returns the first batch
# of a fetch whatever its size, KIP-74).
FETCH_CONFIG: dict[str, Any] = {
    "queued.max.messages.kbytes": 1024,
    "queued.min.messages": 1000,
    "fetch.message.max.bytes": 1024 * 1024,
    "fetch.max.bytes": 4 * 1024 * 1024,
}


@dataclass(frozen=True)
class MembershipConfig:
    protocol: groups.GroupProtocol = "consumer"
    instance_id: str | None = None  # classic static membership only
    session_timeout_s: float | None = None  # classic only; KIP-848: a group config
    extra: dict[str, Any] = field(default_factory=dict)


class Membership:
    """Parameters: `settings`, `group`, `topics` (the inputs: the prompts, and
    a `regenerate-turns` run's turns), `worker` (name), `config`,
    `on_assign` / `on_revoke` / `on_lost` (called with the slot), `want_paused`
    (the worker's current wish), `watchdog`."""

    def __init__(self, *, settings: Settings, group: str, topics: tuple[str, ...], worker: str,
                 config: MembershipConfig, on_assign: Callback, on_revoke: Callback,
                 on_lost: Callback, want_paused: Callable[[], bool],
                 watchdog: Watchdog | None = None) -> None:
        self.settings = settings
        self.group = group
        self.topics = topics
        self.worker = worker
        self.config = config
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost
        self._want_paused = want_paused
        self._watchdog = watchdog
        self.slots: dict[str, Slot] = {}
        self._numbers = 0
        self.paused = False
        self._rotation = 0
        self._closed = 0  # slots closed, for the crash point

    # -- slots -----------------------------------------------------------------

    def open(self) -> Slot:
        name = slot_name(self.worker, self._numbers)
        self._numbers += 1
        extra: dict[str, Any] = {
            **FETCH_CONFIG, **self.config.extra,
            **groups.member_config(self.config.protocol, client_id=name,
                                   session_timeout_s=self.config.session_timeout_s,
                                   instance_id=self.config.instance_id)}
        consumer = clients.consumer(self.settings, self.group, extra)
        slot = Slot(name, consumer)
        self.slots[name] = slot
        self._subscribe(slot)
        log.info("slot opened", slot=name, slots=len(self.slots))
        return slot

    def close(self, name: str) -> None:
        """Leave the group with this slot: its partitions are revoked (the
        worker commits what is ready) and handed over at once."""
        slot = self.slots.get(name)
        if slot is None:
            return
        slot.closing = True
        self._closed += 1
        crashpoints.reached("group.closing", self._closed)
        try:
            self._guarded(f"closing consumer {name}", slot.consumer.close)
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing a slot", slot=name, error=str(exc))
        self.slots.pop(name, None)
        log.info("slot closed", slot=name, slots=len(self.slots))

    def rejoin(self, name: str) -> None:
        """Leave and join again (classic protocol): starts a new rebalance."""
        slot = self.slots[name]
        slot.consumer.unsubscribe()
        self._subscribe(slot)

    def rejoin_all(self) -> None:
        for name in list(self.slots):
            self.rejoin(name)

    def close_all(self) -> None:
        for name in list(self.slots):
            self.close(name)

    def _subscribe(self, slot: Slot) -> None:
        slot.consumer.subscribe(list(self.topics),
                                on_assign=lambda c, ps: self._assigned(slot, ps),
                                on_revoke=lambda c, ps: self._revoked(slot, ps),
                                on_lost=lambda c, ps: self._lost(slot, ps))

    # -- polling ---------------------------------------------------------------

    def poll(self, max_messages: int) -> list[tuple[str, Message]]:
        """Messages from every slot, each with the slot's name (rebalance
        callbacks run in here). A fatal consumer error ends the worker."""
        out: list[tuple[str, Message]] = []
        names = list(self.slots)
        if not names:
            return out
        self._rotation = (self._rotation + 1) % len(names)
        for name in names[self._rotation:] + names[:self._rotation]:
            slot = self.slots.get(name)
            if slot is None:
                continue
            room = max(1, max_messages - len(out))
            for message in slot.consumer.consume(num_messages=min(room, 1000), timeout=0):
                error = message.error()
                if error is None:
                    out.append((name, message))
                elif error.fatal() or clients.refused_by_acl(error):  # a missing ACL
                    raise KafkaFatal(f"consumer {name} of {self.group}: {error.str()}")
                elif error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error", slot=name, error=error.str())
        return out

    # -- pause -----------------------------------------------------------------

    def apply_pause(self, want: bool) -> None:
        if want == self.paused:
            return
        self.paused = want
        for slot in self.slots.values():
            self._set_paused(slot, slot.consumer.assignment(), want)

    @staticmethod
    def _set_paused(slot: Slot, partitions: list[TopicPartition], paused: bool) -> None:
        if partitions:
            (slot.consumer.pause if paused else slot.consumer.resume)(partitions)

    # -- offsets -----------------------------------------------------------------

    def group_offsets(self, by_slot: Mapping[str, Mapping[tuple[str, int], int]]
                      ) -> list[GroupOffsets]:
        """Each slot's next offsets with its fresh group metadata, for the
        transaction; a slot closed meanwhile sends none."""
        return [self.slots[name].group_offsets(offsets) for name, offsets in by_slot.items()
                if name in self.slots]

    def committed(self, slot: Slot, partitions: list[TopicPartition]
                  ) -> dict[tuple[str, int], int | None]:
        found: start_offsets.Start = self._guarded(
            "reading committed offsets", lambda: start_offsets.committed_offsets(
                slot.consumer, partitions, timeout_s=max(5.0, self.settings.connect_timeout_s),
                who=slot.name))
        return found

    # -- callbacks (inside consume()/close(), on the loop thread) ---------------

    def _assigned(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        if slot.closing:
            start_offsets.assign_unread(slot.consumer, partitions, who=slot.name)
            return
        slot.partitions |= {tp.partition for tp in partitions}
        self._on_assign(slot, partitions)  # may set start offsets on `partitions`
        slot.consumer.incremental_assign(partitions)
        # Pause state follows the worker's wish on every assignment: an old
        # paused flag must not survive a lost -> assign cycle.
        self._set_paused(slot, partitions, self._want_paused())

    def _revoked(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        self._on_revoke(slot, partitions)
        slot.partitions -= {tp.partition for tp in partitions}

    def _lost(self, slot: Slot, partitions: list[TopicPartition]) -> None:
        self._on_lost(slot, partitions)
        slot.partitions -= {tp.partition for tp in partitions}

    def _guarded(self, what: str, call: Callable[[], Any]) -> Any:
        if self._watchdog is None:
            return call()
        with self._watchdog.guard(what, CLOSE_LIMIT_S):
            return call()
