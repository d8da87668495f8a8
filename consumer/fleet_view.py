"""Observe the fleet from Kafka's own state (three admin requests): the
group's members with their partitions (KIP-848 describe), the group's
committed offsets and every partition's last stable offset. No channel of
our own: every worker sees the same facts. Blocking; call it off the loop.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from consumer.fleet import FleetView, Member, worker_of
from tokenmill.kafka import groups


class ViewUnavailable(RuntimeError):
    """The admin requests failed (broker restarting, coordinator moving)."""


def read_view(admin: AdminClient, offsets: Consumer, *, group: str, topic: str,
              partitions: int, timeout_s: float = 10.0) -> tuple[FleetView, groups.GroupState]:
    """`offsets`: a consumer of the group that never subscribes, only reads
    its committed offsets (the admin call for them, list_consumer_group_
    offsets, was seen to crash librdkafka 2.16 while the coordinator loads)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        state = groups.describe(admin, group, topic, timeout_s)
        found = offsets.committed(tps, timeout=timeout_s)
        ends = admin.list_offsets(
            {tp: OffsetSpec.latest() for tp in tps},
            isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s)
        end = {tp.partition: int(f.result().offset) for tp, f in ends.items()}
    except KafkaException as exc:
        raise ViewUnavailable(str(exc.args[0] if exc.args else exc)) from None
    members = tuple(Member(worker=worker_of(m.client_id), slot=m.client_id,
                           partitions=m.partitions) for m in state.members)
    committed = {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    view = FleetView(at=time.monotonic(), stable=state.stable, members=members,
                     committed=committed, end=end, partitions=partitions)
    return view, state
