"""Fleet balancing: the task that watches the group and opens and closes
this worker's slots so that its share of the run follows its measured
capacity (KIP-848; the decision is consumer/fleet.py's, the view
consumer/fleet_view.py's, the drain before a hand-over
consumer/handover.py's). Under the classic protocol it repairs stranded
partitions instead (tokenmill/kafka/stranded.py).

The fleet view sees the prompts topic only: with a regenerate-turns run's
turns it would close slots as "no work left" while turns flow, so such
runs keep one slot and the group's assignor.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from consumer.config import WorkerConfig
from consumer.fleet import FleetView, RateTracker, decide, initial_slots
from consumer.fleet_view import ViewUnavailable, read_view
from consumer.handover import Handovers, drain_limit_s
from consumer.membership import Membership
from consumer.metrics import ConsumerMetrics
from consumer.ownership import Ownership
from schemas import RunSpec
from tokenmill.kafka import clients
from tokenmill.kafka.stranded import StrandedRepair
from tokenmill.log import get_logger
from tokenmill.settings import Settings

log = get_logger("tokenmill.consumer")


class Balancing:
    """Parameters: `settings`, `config`, `spec` (the run), `group`, `topic`
    (the prompts), `chained` (a regenerate-turns run), `members`,
    `ownership` (requests in flight per slot), `metrics`, `latency_s` (the
    worker's request latency now)."""

    def __init__(self, *, settings: Settings, config: WorkerConfig, spec: RunSpec, group: str,
                 topic: str, chained: bool, members: Membership, ownership: Ownership,
                 metrics: ConsumerMetrics, latency_s: Callable[[], float]) -> None:
        self.settings = settings
        self.config = config
        self.spec = spec
        self.group = group
        self.topic = topic
        self.members = members
        self.ownership = ownership
        self.metrics = metrics
        self._latency_s = latency_s
        # Capacity-weighted slots: KIP-848 only, and not for turn runs.
        self.balanced = (config.group_protocol == "consumer" and config.fleet_balancing
                         and not chained)
        self.others_seen = False  # another worker was in the group at the last look
        self._last_workers: frozenset[str] = frozenset()  # at the previous fleet view
        self._rates = RateTracker()
        self._handovers = Handovers()  # donated slots draining before they close

    def initial_slots(self) -> int:
        """Slots to open at start."""
        return initial_slots(self.spec.partitions, self.spec.gpus) if self.balanced else 1

    def draining(self, slot: str) -> bool:
        """The slot is being handed over: start no new request on it."""
        return slot in self._handovers

    def hands_over(self) -> bool:
        """With other workers in the group, a stopping worker gives its
        partitions up at once (its requests in flight are redone there);
        alone, it drains them first."""
        return self.others_seen and self.config.group_protocol == "consumer"

    async def run(self, stopping: Callable[[], bool]) -> None:
        """Watch the group; open and close this worker's slots (KIP-848), or
        repair partitions no member owns (classic)."""
        admin = clients.admin(self.settings)
        offsets = clients.consumer(self.settings, self.group)  # never subscribes
        stranded = StrandedRepair(f"{self.config.instance}#",
                                  grace_s=3 * self.config.fleet_interval_s,
                                  rejoin=self.members.rejoin_all)
        try:
            await self._watch(admin, offsets, stranded, stopping)
        finally:
            offsets.close()

    async def _watch(self, admin: AdminClient, offsets: Consumer, stranded: StrandedRepair,
                     stopping: Callable[[], bool]) -> None:
        while not stopping():
            await asyncio.sleep(self.config.fleet_interval_s)
            try:
                view, state = await asyncio.to_thread(
                    read_view, admin, offsets, group=self.group, topic=self.topic,
                    partitions=self.spec.partitions,
                    timeout_s=max(5.0, self.settings.connect_timeout_s))
            except ViewUnavailable as exc:
                log.debug("fleet view unavailable", error=str(exc))
                continue
            if stopping():
                return
            self._see_others(view)
            self._rates.observe(view)
            if self.config.group_protocol == "classic":
                stranded.observe(state, self.spec.partitions)
                continue
            if self.balanced:
                workers = frozenset(view.workers())
                settled = workers == self._last_workers
                self._last_workers = workers
                self._balance(view, settled)

    def _see_others(self, view: FleetView) -> None:
        others = sorted({m.worker for m in view.members} - {self.config.instance})
        if bool(others) != self.others_seen:
            log.info("fleet: other workers in the group" if others
                     else "fleet: alone in the group", workers=others)
        self.others_seen = bool(others)

    def _balance(self, view: FleetView, settled: bool) -> None:
        if self._handovers:
            return  # one move at a time: the view still shows the draining slot
        members = self.members
        latency_s = self._latency_s()
        decision = decide(view, self._rates.rates_for(view.workers() | {self.config.instance}),
                          self.config.instance, my_latency_s=latency_s, settled=settled)
        # The view may predate a slot this worker closed since.
        decision = msgspec.structs.replace(
            decision, close=tuple(n for n in decision.close if n in members.slots))
        if decision.open or decision.close:
            log.info("fleet: adjusting slots", open=decision.open, close=list(decision.close),
                     why=decision.why)
        for _ in range(decision.open):
            members.open()
        now = time.monotonic()
        for name in decision.close:  # all open: filtered above
            if members.slots[name].partitions:
                # A donation: drain first (no new requests there), close after.
                self._handovers.start(name, now, drain_limit_s(latency_s))
            else:
                # Even its last one: a standby opened now would compete with
                # the receiver's for the freed partition; it rejoins next round.
                members.close(name)
        self.close_drained()
        self.metrics.slots.set(len(members.slots))

    def close_drained(self) -> None:
        """Close the donating slots whose requests have all finished (their
        results are committed by the revoke) or whose drain limit passed."""
        if not self._handovers:
            return
        for name, drained in self._handovers.due(time.monotonic(), self.ownership.in_flight_of):
            if name in self.members.slots:
                log.info("fleet: handing a partition over", slot=name, drained=drained)
                self.members.close(name)
        self.metrics.slots.set(len(self.members.slots))
