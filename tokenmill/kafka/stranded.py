"""Repair of the classic protocol's stranded partitions, for any service
whose members join a group (workers, sinks).

A member killed in the middle of a classic rebalance can leave partitions
owned by no member of a STABLE group (KAFKA-13435 and relatives).
`groups.StrandedWatch` notices them and names the one member that acts;
that member rejoins the group, which starts the rebalance that assigns
them. KIP-848 groups need none of this: the broker assigns.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tokenmill.kafka import groups
from tokenmill.log import get_logger

log = get_logger("tokenmill.kafka.stranded")


class StrandedRepair:
    """Parameters: `client_id_prefix` (this service's members, e.g.
    `<instance>#`), `grace_s` (how long partitions stay unowned before they
    count as stranded), `rejoin` (leave the group and join it again)."""

    def __init__(self, client_id_prefix: str, *, grace_s: float,
                 rejoin: Callable[[], None]) -> None:
        self._watch = groups.StrandedWatch(client_id_prefix, grace_s=grace_s)
        self._rejoin = rejoin

    def observe(self, state: groups.GroupState, partitions: int,
                now: float | None = None) -> bool:
        """The group as just described: rejoin when this member must repair
        it. True when it rejoined."""
        if not self._watch.check(state, partitions, now):
            return False
        self._rejoin()
        return True

    def check(self, admin: AdminClient, group: str, topic: str, partitions: int,
              timeout_s: float = 5.0) -> bool:
        """Describe the group (blocking, bounded by `timeout_s`), then
        `observe`; a group the broker cannot describe now is skipped (logged)."""
        try:
            state = groups.describe(admin, group, topic, timeout_s)
        except KafkaException as exc:
            log.debug("group description unavailable", error=str(exc))
            return False
        return self.observe(state, partitions)
