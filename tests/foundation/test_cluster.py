"""A 3-node KRaft cluster from the dev stack survives the loss of one broker
the way Kafka's own system tests bounce brokers: replication factor 3,
min.insync.replicas 2, transactions and read_committed keep working while a
broker is down (killed or cleanly stopped), and the broker rejoins the ISR
when it is back. Checked with kafka-python, a client that shares no code
with tokenmill."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource
from kafka.errors import KafkaConnectionError

from devstack import processes
from devstack.private import PrivateStack
from tests.kafka_helpers import read_all
from tokenmill.kafka import clients
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _partitions(admin: KafkaAdminClient, topic: str, timeout_s: float = 60.0) -> list[dict]:
    """The topic's partitions, once the broker asked knows the topic (a topic
    just created reaches every broker's metadata a moment later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            described = admin.describe_topics([topic])
        except KafkaConnectionError:  # it asked the broker just killed: ask again
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # poll of a wait loop
            continue
        if not described[0]["error_code"] and described[0]["partitions"]:
            return sorted(described[0]["partitions"], key=lambda p: p["partition_index"])
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} not described within {timeout_s}s: {described}")
        time.sleep(0.5)  # poll of a wait loop


def _topic_config(admin: KafkaAdminClient, topic: str, key: str) -> str:
    """The value the topic really has (its own, or the broker's default)."""
    described = admin.describe_configs([ConfigResource("TOPIC", topic)], config_filter="all")
    return str(described["topic"][topic][key]["value"])


def _wait_isr(admin: KafkaAdminClient, topic: str, check: Callable[[set[int]], bool],
              timeout_s: float = 120.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        partitions = _partitions(admin, topic)
        if partitions and all(check(set(p["isr_nodes"])) for p in partitions):
            return partitions
        if time.monotonic() > deadline:
            raise AssertionError(f"ISR of {topic} not as expected within {timeout_s}s: "
                                 f"{[(p['partition_index'], p['isr_nodes']) for p in partitions]}")
        time.sleep(0.5)  # poll of a wait loop


def _committed_batch(producer: Producer, topic: str, values: list[str], *, commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value.encode())
    if commit:
        producer.commit_transaction(120)
    else:
        producer.flush(120)
        producer.abort_transaction(120)


def test_three_brokers_survive_a_kill_and_a_clean_stop(
        private_stack: Callable[..., PrivateStack]) -> None:
    stack = private_stack(brokers=3)
    assert len(stack.bootstrap.split(",")) == 3
    admin = KafkaAdminClient(bootstrap_servers=stack.bootstrap.split(","))
    try:
        assert sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"]) == [1, 2, 3]

        # A topic created the way tokenmill creates its run topics (the broker's
        # default replication factor) gets 3 replicas and min.insync.replicas 2.
        topic = f"t{uuid.uuid4().hex[:10]}.events"
        clients.ensure_topics(clients.admin(Settings(bootstrap_servers=stack.bootstrap)),
                                    {topic: 4})
        partitions = _wait_isr(admin, topic, lambda isr: isr == {1, 2, 3})
        assert all(len(p["replica_nodes"]) == 3 for p in partitions)
        assert _topic_config(admin, topic, "min.insync.replicas") == "2"

        producer = Producer({"bootstrap.servers": stack.bootstrap,
                             "transactional.id": f"{topic}-txn",
                             "log_level": 2})  # brokers going down is the point
        producer.init_transactions(120)
        _committed_batch(producer, topic, [f"before-{i}" for i in range(20)], commit=True)

        # Kafka's internal topics are replicated the same way.
        group_reader = KafkaConsumer(topic, bootstrap_servers=stack.bootstrap.split(","),
                                     group_id=f"{topic}-group", auto_offset_reset="earliest",
                                     enable_auto_commit=False, consumer_timeout_ms=20000)
        assert next(iter(group_reader)) is not None
        group_reader.commit()
        group_reader.close()
        for internal in ("__transaction_state", "__consumer_offsets"):
            assert all(len(p["replica_nodes"]) == 3 for p in _partitions(admin, internal))
            assert _topic_config(admin, internal, "min.insync.replicas") == "2"

        # SIGKILL the leader of partition 0: leadership moves, the ISR shrinks
        # to two, and transactions still commit (two in sync is enough).
        victim = stack.broker(partitions[0]["leader_id"])
        old_pid = victim.pid
        victim.kill()
        assert not victim.is_running() and not processes.alive(old_pid)
        _wait_isr(admin, topic, lambda isr: victim.node_id not in isr and len(isr) == 2)
        _committed_batch(producer, topic, [f"during-kill-{i}" for i in range(20)], commit=True)
        _committed_batch(producer, topic, [f"aborted-{i}" for i in range(20)], commit=False)
        seen = [r.value.decode() for r in read_all(stack.bootstrap, topic)]
        assert sorted(seen) == sorted([f"before-{i}" for i in range(20)]
                                      + [f"during-kill-{i}" for i in range(20)])

        # The same command line on the same data dir: it rejoins every ISR.
        victim.start()
        assert victim.is_running() and victim.pid != old_pid
        victim.wait_ready()
        _wait_isr(admin, topic, lambda isr: isr == {1, 2, 3})

        # A clean stop (SIGTERM, controlled shutdown) of another node.
        other = stack.broker(victim.node_id % 3 + 1)
        other.stop()
        assert not other.is_running()
        _wait_isr(admin, topic, lambda isr: other.node_id not in isr and len(isr) == 2)
        _committed_batch(producer, topic, [f"during-stop-{i}" for i in range(20)], commit=True)
        other.start()
        other.wait_ready()
        _wait_isr(admin, topic, lambda isr: isr == {1, 2, 3})
        _committed_batch(producer, topic, [f"after-{i}" for i in range(20)], commit=True)
        producer.flush(30)

        seen = [r.value.decode() for r in read_all(stack.bootstrap, topic)]
        expected = [f"{phase}-{i}" for phase in ("before", "during-kill", "during-stop", "after")
                    for i in range(20)]
        assert sorted(seen) == sorted(expected)
        assert len(seen) == len(set(seen))
    finally:
        admin.close()
    pids = [broker.pid for broker in stack.brokers] + [stack.state.s3.pid]
    assert sorted(stack.down()) == ["kafka-1", "kafka-2", "kafka-3", "s3"]
    assert not any(processes.group_alive(pid) for pid in pids)
