"""Consumer groups, as workers and sinks join them: the client settings of
each group protocol, the group's session timeout, what the group looks like
from outside, and the classic protocol's stranded partitions.

KIP-848 (`group.protocol=consumer`, Kafka 4.0+) is the default: the broker
assigns (`uniform`, sticky, incremental), members are dynamic, so a member
that closes leaves at once and its partitions move within a heartbeat, and
one that dies keeps them for the group's session timeout. Static membership
is not used with it: a restarted member with the same `group.instance.id`
is refused (UNRELEASED_INSTANCE_ID) until the old one's session expires,
and a cleanly closed static member keeps its partitions for that long.

The classic protocol (cooperative-sticky) stays for older brokers. There a
member killed in the middle of a rebalance could leave partitions owned by
no member of a STABLE group (KAFKA-13435 and relatives); `StrandedWatch`
notices and one member rejoins, which starts the rebalance that assigns them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaException

# confluent-kafka re-exports its admin types without __all__ (see committed.py).
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from tokenmill.log import get_logger

log = get_logger("tokenmill.kafka.groups")

GroupProtocol = Literal["consumer", "classic"]
CLASSIC_SESSION_TIMEOUT_S = 30.0
CONFIG_VISIBLE_S = 5.0  # for a new group config to be described by the broker
CONFIG_POLL_S = 0.05


def member_config(protocol: GroupProtocol, *, client_id: str,
                  session_timeout_s: float | None = None,
                  instance_id: str | None = None) -> dict[str, Any]:
    """librdkafka settings of one group member under `protocol`."""
    if protocol == "consumer":
        # KIP-848: session and heartbeat are the broker's (a group config),
        # and librdkafka rejects the classic settings.
        return {"client.id": client_id, "group.protocol": "consumer",
                "group.remote.assignor": "uniform"}
    session_ms = int((session_timeout_s or CLASSIC_SESSION_TIMEOUT_S) * 1000)
    config: dict[str, Any] = {
        "client.id": client_id,
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": max(100, session_ms // 10),
    }
    if instance_id:
        config["group.instance.id"] = instance_id
    return config


def set_session_timeout(admin: AdminClient, group: str, seconds: float,
                        timeout_s: float = 10.0) -> bool:
    """KIP-848: the group's own session timeout (and a heartbeat interval to
    match), within the broker's group.consumer.min/max bounds. False (and a
    warning) when the broker refuses; its default then applies."""
    session_ms = int(seconds * 1000)
    # Members learn a new assignment at their next heartbeat, so the interval
    # bounds how fast partitions move (start, hand-over, donations).
    heartbeat_ms = max(500, min(5000, session_ms // 10))
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", str(session_ms),
                    incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", str(heartbeat_ms),
                    incremental_operation=AlterConfigOpType.SET)])
    try:
        for future in admin.incremental_alter_configs([resource],
                                                      request_timeout=timeout_s).values():
            future.result()
    except KafkaException as exc:
        log.warning("could not set the group's session timeout; the broker's default applies",
                    group=group, session_timeout_s=seconds,
                    error=str(exc.args[0] if exc.args else exc))
        return False
    _await_session_timeout(admin, group, session_ms)
    return True


def _await_session_timeout(admin: AdminClient, group: str, session_ms: int) -> None:
    """Wait (within CONFIG_VISIBLE_S) until the broker describes the group's
    new session timeout. The write returns once the controller took it; the
    coordinator applies it when the record reaches its broker, and it sets a
    member's session at each heartbeat. A member that joined first and died
    before its next heartbeat kept its partitions for the broker's default
    (20 s here instead of 6 s; a CI run's sink taking over waited for it)."""
    deadline = time.monotonic() + CONFIG_VISIBLE_S
    wanted = str(session_ms)
    while True:
        try:
            futures = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)],
                                             request_timeout=CONFIG_VISIBLE_S)
            entries = next(iter(futures.values())).result()
            entry = entries.get("consumer.session.timeout.ms")
            if entry is not None and entry.value == wanted:
                return
        except KafkaException:
            pass  # described below, once the wait is over
        if time.monotonic() >= deadline:
            log.warning("the group's session timeout is not in effect yet; a member that "
                        "dies before its next heartbeat keeps its partitions for the "
                        "broker's default", group=group, session_timeout_ms=session_ms)
            return
        time.sleep(CONFIG_POLL_S)


@dataclass(frozen=True)
class GroupMember:
    client_id: str
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class GroupState:
    stable: bool  # STABLE, and (KIP-848) every member holds its target assignment
    members: tuple[GroupMember, ...]

    def unowned(self, partitions: int) -> set[int]:
        owned = {p for m in self.members for p in m.partitions}
        return set(range(partitions)) - owned


def describe(admin: AdminClient, group: str, topic: str, timeout_s: float = 10.0) -> GroupState:
    """The group from outside (raises KafkaException when the broker cannot say)."""
    described = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result()
    stable = str(getattr(described.state, "name", described.state)).upper() == "STABLE"
    members = []
    for member in described.members:
        owned = tuple(sorted(tp.partition for tp in member.assignment.topic_partitions
                             if tp.topic == topic))
        target = getattr(member, "target_assignment", None)
        if target is not None:
            wanted = tuple(sorted(tp.partition for tp in target.topic_partitions
                                  if tp.topic == topic))
            stable = stable and wanted == owned
        members.append(GroupMember(member.client_id or member.member_id, owned))
    return GroupState(stable, tuple(members))


class StrandedWatch:
    """Classic protocol: partitions owned by no member of a stable group for
    longer than `grace_s` are stranded. `check` says whether this member
    (the first by client id, so that one member acts) should rejoin now."""

    def __init__(self, client_id_prefix: str, grace_s: float = 10.0) -> None:
        self.prefix = client_id_prefix
        self.grace_s = grace_s
        self._since: float | None = None

    def check(self, state: GroupState, partitions: int, now: float | None = None) -> set[int]:
        """The stranded partitions when this member must repair them, else {}."""
        now = time.monotonic() if now is None else now
        missing = state.unowned(partitions)
        if not (missing and state.stable and state.members):
            self._since = None
            return set()
        self._since = self._since if self._since is not None else now
        if now - self._since < self.grace_s:
            return set()
        self._since = None
        first = min(m.client_id for m in state.members)
        log.warning("partitions owned by no member of a stable group",
                    partitions=sorted(missing), repairing=first.startswith(self.prefix))
        return missing if first.startswith(self.prefix) else set()
