"""Observe the fleet from Kafka's own state (one admin request, two of a
consumer that never subscribes): the group's members with their partitions
(KIP-848 describe), the group's committed offsets and every partition's last
stable offset. No channel of our own: every worker sees the same facts.
Blocking; call it off the loop.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from consumer.fleet import FleetView, Member, worker_of
from tokenmill.kafka import committed as committed_reads
from tokenmill.kafka import groups


class ViewUnavailable(RuntimeError):
    """The admin requests failed (broker restarting, coordinator moving)."""


def read_view(admin: AdminClient, offsets: Consumer, *, group: str, topic: str,
              partitions: int, timeout_s: float = 10.0) -> tuple[FleetView, groups.GroupState]:
    """`offsets`: a consumer of the group that never subscribes (read_committed),
    only reads its committed offsets and the partitions' ends. The admin calls
    for them misbehave in librdkafka 2.16: list_consumer_group_offsets was seen
    to crash it while the coordinator loads, and list_offsets with a leader
    down spins (committed.consumer_last_stable_offsets says how)."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        state = groups.describe(admin, group, topic, timeout_s)
        found = offsets.committed(tps, timeout=timeout_s)
        end = committed_reads.consumer_last_stable_offsets(offsets, topic,
                                                            list(range(partitions)), timeout_s)
    except KafkaException as exc:
        raise ViewUnavailable(str(exc.args[0] if exc.args else exc)) from None
    members = tuple(Member(worker=worker_of(m.client_id), slot=m.client_id,
                           partitions=m.partitions) for m in state.members)
    committed = {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    view = FleetView(at=time.monotonic(), stable=state.stable, members=members,
                     committed=committed, end=end, partitions=partitions)
    return view, state
