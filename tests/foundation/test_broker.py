"""The dev broker is a real Apache Kafka with real transaction semantics and
cooperative rebalancing: the guarantees of every later test stand on this."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaAdminClient

from tests.kafka_helpers import committed_offsets, create_topic, read_all

pytestmark = pytest.mark.broker


def test_kafka_python_identifies_apache_kafka(services) -> None:
    admin = KafkaAdminClient(bootstrap_servers=services.bootstrap_servers)
    try:
        cluster = admin.describe_cluster()
        assert cluster["cluster_id"]
        assert cluster["brokers"]
        versions = admin._client.check_version()  # negotiated through ApiVersions
        assert tuple(versions) >= (3, 0)
    finally:
        admin.close()


def _txn_producer(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    producer.init_transactions(30)
    return producer


def test_read_committed_hides_aborted_and_shows_committed(services, run_id) -> None:
    topic = f"{run_id}.txn"
    create_topic(services.bootstrap_servers, topic, 1)
    producer = _txn_producer(services.bootstrap_servers, f"{run_id}-txn")

    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"aborted-{i}".encode())
    producer.flush()
    producer.abort_transaction(30)

    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=f"committed-{i}".encode())
    producer.commit_transaction(30)

    committed = [r.value.decode() for r in read_all(services.bootstrap_servers, topic)]
    assert committed == ["committed-0", "committed-1", "committed-2"]
    everything = [r.value.decode() for r in
                  read_all(services.bootstrap_servers, topic, committed_only=False)]
    assert sum(v.startswith("aborted") for v in everything) == 5


def test_offsets_sent_with_a_transaction_commit_only_with_it(services, run_id) -> None:
    source, sink, group = f"{run_id}.in", f"{run_id}.out", f"{run_id}-group"
    create_topic(services.bootstrap_servers, source, 1)
    create_topic(services.bootstrap_servers, sink, 1)
    plain = Producer({"bootstrap.servers": services.bootstrap_servers})
    for i in range(10):
        plain.produce(source, value=str(i).encode())
    plain.flush()

    consumer = Consumer({"bootstrap.servers": services.bootstrap_servers, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(source, 0, 0)])
    messages = consumer.consume(10, timeout=15)
    assert len(messages) == 10
    producer = _txn_producer(services.bootstrap_servers, f"{run_id}-eos")

    producer.begin_transaction()
    producer.produce(sink, value=b"result-a")
    producer.send_offsets_to_transaction(
        [TopicPartition(source, 0, 5)], consumer.consumer_group_metadata(), 30)
    assert committed_offsets(services.bootstrap_servers, group, source)[0] is None
    producer.abort_transaction(30)
    assert committed_offsets(services.bootstrap_servers, group, source)[0] is None

    producer.begin_transaction()
    producer.produce(sink, value=b"result-b")
    producer.send_offsets_to_transaction(
        [TopicPartition(source, 0, 10)], consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    consumer.close()
    assert committed_offsets(services.bootstrap_servers, group, source)[0] == 10
    assert [r.value for r in read_all(services.bootstrap_servers, sink)] == [b"result-b"]


class _Member:
    """A consumer in its own thread that records every assignment event."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.events: list[tuple[str, frozenset[int]]] = []
        self.owned: set[int] = set()
        self.stop = threading.Event()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group,
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "session.timeout.ms": 10_000, "heartbeat.interval.ms": 500,
        })
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _assign(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        self.events.append(("assign", frozenset(p.partition for p in partitions)))
        self.owned |= {p.partition for p in partitions}

    def _revoke(self, _c: Consumer, partitions: list[TopicPartition]) -> None:
        self.events.append(("revoke", frozenset(p.partition for p in partitions)))
        self.owned -= {p.partition for p in partitions}

    def _loop(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.2)
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(20)


def _wait(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)  # poll of a wait loop
    raise AssertionError("condition not reached in time")


def test_cooperative_rebalance_moves_only_some_partitions(services, run_id) -> None:
    topic, group = f"{run_id}.coop", f"{run_id}-coop"
    create_topic(services.bootstrap_servers, topic, 4)
    first = _Member(services.bootstrap_servers, group, topic)
    second = None
    try:
        _wait(lambda: first.owned == {0, 1, 2, 3})
        second = _Member(services.bootstrap_servers, group, topic)
        _wait(lambda: len(second.owned) > 0 and len(first.owned) + len(second.owned) == 4
              and not first.owned & second.owned)
        assert first.owned, "the first member kept some partitions"
        revoked = set().union(*(parts for kind, parts in first.events if kind == "revoke"))
        # Incremental: only the partitions that moved were revoked, never all four.
        assert revoked == second.owned
        assert len(revoked) < 4
    finally:
        first.close()
        if second:
            second.close()
