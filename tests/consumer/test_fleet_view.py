"""The fleet view's partition ends (consumer/fleet_view.py reads them with
committed.consumer_last_stable_offsets), on the real broker: a
never-subscribing read_committed consumer's offsets_for_times stands in for
admin.list_offsets (which spins on a down leader in librdkafka 2.16), so it
must give exactly what the admin call gives: the last stable offset, below a
transaction still open, not the high watermark."""

from __future__ import annotations

import os

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tokenmill.kafka import clients, committed

pytestmark = pytest.mark.broker


def test_the_ends_are_the_last_stable_offsets_not_the_high_watermarks(settings) -> None:
    bootstrap = settings.bootstrap_servers
    topic = f"fleet-view-{os.urandom(4).hex()}"
    creator = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result
    creator.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    plain = Producer({"bootstrap.servers": bootstrap})
    for partition, count in ((0, 3), (1, 1)):
        for _ in range(count):
            plain.produce(topic, b"decided", partition=partition)
    plain.flush(30)
    open_transaction = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    open_transaction.init_transactions(30)
    open_transaction.begin_transaction()
    for _ in range(5):
        open_transaction.produce(topic, b"undecided", partition=0)
    open_transaction.flush(30)
    plain.produce(topic, b"after the open transaction", partition=0)
    plain.flush(30)

    offsets = clients.consumer(settings, f"{topic}.group")  # never subscribes
    admin = clients.admin(settings)
    try:
        ends = committed.consumer_last_stable_offsets(offsets, topic, [0, 1, 2], 30)
        by_admin = committed.last_stable_offsets(admin, topic, [0, 1, 2], 30)
        high = committed.high_watermarks(admin, topic, [0], 30)
    finally:
        offsets.close()
        open_transaction.abort_transaction(30)
    assert ends == {0: 3, 1: 1, 2: 0}
    assert ends == by_admin
    assert high == {0: 9}  # the open transaction's records count there
