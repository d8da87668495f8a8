"""Reading a partition's committed records to its end (tokenmill/kafka/committed.py),
on the real broker. A restarted service takes its counters and checkpoints
from such a read, so a read that stops short is a silent error: it hands
back an older value. These tests pin the end exactly: aborted records and
transaction markers at the tail, and a broker that goes quiet mid-read."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tokenmill.kafka import clients, compacted
from tokenmill.kafka.committed import (
    READER_CONFIG,
    last_stable_offsets,
    read_error_is_final,
    read_partition,
)

pytestmark = pytest.mark.broker


def _topic(bootstrap: str) -> str:
    topic = f"committed-read-{os.urandom(4).hex()}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def _write(bootstrap: str, topic: str, transactions: int, *, abort_last: int = 0) -> None:
    """`transactions` committed transactions, each setting key "count" to its
    number (and a few other keys), then `abort_last` aborted ones whose
    records did reach the broker."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    for i in range(1, transactions + abort_last + 1):
        producer.begin_transaction()
        for other in range(3):
            producer.produce(topic, key=f"other-{other}", value=b"x" * 200)
        producer.produce(topic, key="count", value=str(i).encode())
        if i > transactions:
            producer.flush(30)  # on the broker, then aborted
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)


def test_a_tail_of_aborted_records_and_markers_is_read_through_at_once(settings) -> None:
    bootstrap = settings.bootstrap_servers
    topic = _topic(bootstrap)
    _write(bootstrap, topic, 20, abort_last=3)
    started = time.monotonic()
    values = compacted.read_to_end(settings, topic)
    elapsed = time.monotonic() - started
    assert values["count"] == b"20"  # the aborted 21-23 never show
    # reached through the end event, not a timeout (60 s)
    assert elapsed < compacted.READ_TIMEOUT_S / 2, elapsed


def test_a_broker_that_goes_quiet_mid_read_never_yields_a_short_read(private_stack) -> None:
    stack = private_stack()
    bootstrap = stack.bootstrap
    topic = _topic(bootstrap)
    _write(bootstrap, topic, 50)
    settings = stack.settings()
    end = last_stable_offsets(clients.admin(settings), topic, [0], 30)[0]
    consumer = clients.consumer(settings, "committed-read-test", READER_CONFIG)
    broker_pid = stack.broker(1).pid
    frozen_s = 8.0  # longer than any "no data for a while means the end" guess
    os.kill(broker_pid, signal.SIGSTOP)
    thawed = threading.Timer(frozen_s, os.kill, (broker_pid, signal.SIGCONT))
    thawed.start()
    try:
        started = time.monotonic()
        last = None
        for message in read_partition(consumer, topic, 0, end, timeout_s=120):
            if message.key() == b"count":
                last = message.value()
        elapsed = time.monotonic() - started
    finally:
        thawed.join()
        os.kill(broker_pid, signal.SIGCONT)
        consumer.close()
    assert last == b"50", f"a short read after {elapsed:.1f}s: the last value seen was {last!r}"
    assert elapsed >= frozen_s - 0.5, f"the read ended after {elapsed:.1f}s, inside the freeze"


def _open_transaction(bootstrap: str, topic: str) -> Producer:
    """Another producer's transaction, open on the topic with a record on the broker."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-open"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key="someone-else", value=b"pending")
    producer.flush(30)
    return producer


def _committed_behind_an_open_transaction(bootstrap: str) -> tuple[str, Producer]:
    """A topic where "count" is 1, then another producer's transaction opens,
    then "count" = 2 commits; returns the topic and the open transaction's producer."""
    topic = _topic(bootstrap)
    _write(bootstrap, topic, 1)
    other = _open_transaction(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, key="count", value=b"2")
    producer.commit_transaction(30)
    return topic, other


def test_a_value_committed_behind_an_open_transaction_is_read_once_it_is_decided(
        settings) -> None:
    """The last stable offset stops at the open transaction's first record;
    the read waits for it to end instead of returning the value before."""
    topic, other = _committed_behind_an_open_transaction(settings.bootstrap_servers)
    held_s = 3.0
    decided = threading.Timer(held_s, other.abort_transaction, (30,))
    decided.start()
    try:
        started = time.monotonic()
        values = compacted.read_to_end(settings, topic)
        elapsed = time.monotonic() - started
    finally:
        decided.join()
    assert values["count"] == b"2" and "someone-else" not in values
    assert elapsed >= held_s - 0.5, "the read did not wait for the open transaction"


def test_an_undecided_transaction_is_an_error_or_for_a_look_the_decided_part(settings) -> None:
    topic, other = _committed_behind_an_open_transaction(settings.bootstrap_servers)
    try:
        with pytest.raises(compacted.Unsettled, match=topic):
            compacted.read_to_end(settings, topic, settle_s=1.0)
        looked = compacted.read_to_end(settings, topic, settle_s=1.0, stale_ok=True)
        assert looked["count"] == b"1"  # what is decided: before the open transaction
    finally:
        other.abort_transaction(30)


def test_a_read_of_keys_no_undecided_record_holds_does_not_wait(settings) -> None:
    """A member reading its own counters beside another's open transaction:
    when no undecided record has its key, the decided value is final at once
    (it used to wait out the other's transaction timeout); when one has, or
    its value was committed behind the open transaction, it still waits."""
    bootstrap = settings.bootstrap_servers
    topic = _topic(bootstrap)
    _write(bootstrap, topic, 1)
    other = _open_transaction(bootstrap, topic)
    try:
        started = time.monotonic()
        values = compacted.read_to_end(settings, topic, lambda k: k == "count", settle_s=20.0,
                                       few_keys=True)
        assert values == {"count": b"1"}
        assert time.monotonic() - started < 10.0, "waited for a transaction it had no part in"
        with pytest.raises(compacted.Unsettled):
            compacted.read_to_end(settings, topic, lambda k: k == "someone-else", settle_s=1.0,
                                  few_keys=True)
    finally:
        other.abort_transaction(30)
    behind, other = _committed_behind_an_open_transaction(bootstrap)
    try:
        with pytest.raises(compacted.Unsettled):
            compacted.read_to_end(settings, behind, lambda k: k == "count", settle_s=1.0,
                                  few_keys=True)
    finally:
        other.abort_transaction(30)
    assert compacted.read_to_end(settings, behind, lambda k: k == "count",
                                 few_keys=True) == {"count": b"2"}


def test_a_read_given_an_admin_client_makes_none_of_its_own(settings, monkeypatch) -> None:
    """`status` hands one admin client to each of its reads; a read that made
    its own beside it (as `admin or new` did: an idle client is falsy) would
    cost every look a connection and a metadata round trip per read."""
    bootstrap = settings.bootstrap_servers
    topic = _topic(bootstrap)
    _write(bootstrap, topic, 2)
    shared = clients.admin(settings)
    assert not shared  # the trap: nothing queued, so its length is 0

    def no_new_client(_settings):
        raise AssertionError("a read made an admin client of its own")

    monkeypatch.setattr(clients, "admin", no_new_client)
    assert compacted.read_to_end(settings, topic, admin=shared)["count"] == b"2"


def test_a_tail_reads_on_from_its_last_look_and_agrees_with_a_full_read(settings) -> None:
    """A done check's reader (compacted.Tail): each look reads only the
    records written since the one before (the `keep` filter sees each record
    once), takes what is decided past an open transaction, and agrees with a
    full read at every look."""
    topic, other = _committed_behind_an_open_transaction(settings.bootstrap_servers)
    seen: list[str] = []

    def keep(key: str) -> bool:
        seen.append(key)
        return True

    tail = compacted.Tail(settings, topic, keep, settle_s=0.5)
    try:
        looked = tail.look()
        assert looked["count"] == b"1"  # decided: before the open transaction
        assert looked == compacted.read_to_end(settings, topic, settle_s=0.5, stale_ok=True)
        before = len(seen)
        assert before == 4  # the first transaction's four records
        other.commit_transaction(30)
        looked = tail.look()
        assert looked["count"] == b"2" and looked["someone-else"] == b"pending"
        assert looked == compacted.read_to_end(settings, topic)
        assert len(seen) - before == 2, seen[before:]  # only the two records after it
        assert tail.look() == looked and len(seen) - before == 2  # nothing new: nothing read
    finally:
        tail.close()


@pytest.mark.parametrize(("code", "final"), [
    (KafkaError.NOT_COORDINATOR, False),  # a broker restarting mid-read
    (KafkaError._TRANSPORT, False),
    (KafkaError._TIMED_OUT, False),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, True),
    (KafkaError.TOPIC_AUTHORIZATION_FAILED, True),
    (KafkaError._AUTHENTICATION, True),
])
def test_a_read_waits_out_what_the_client_retries_and_ends_on_what_it_cannot(
        code: int, final: bool) -> None:
    assert read_error_is_final(KafkaError(code)) is final


def test_a_fatal_error_ends_a_read_whatever_its_code() -> None:
    assert read_error_is_final(KafkaError(KafkaError.NOT_COORDINATOR, fatal=True))
