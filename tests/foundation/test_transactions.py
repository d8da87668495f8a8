"""The one transaction primitive (tokenmill/kafka/transactions.py): a failure at
every step aborts and leaves nothing visible; retriable failures are
retried; a fenced producer ends as KafkaFatal; a zombie group member is
fenced by its stale group metadata. Against the real broker; what is visible
is read back with kafka-python (`read_committed`)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
from confluent_kafka import KafkaError, TopicPartition

from tests.kafka_helpers import committed_offsets, create_topic, read_all
from tests.rebalance import STALE_MEMBER
from tokenmill.backoff import Backoff
from tokenmill.kafka import clients
from tokenmill.kafka.transactions import (
    ABORT_ATTEMPTS,
    GroupOffsets,
    KafkaFatal,
    TransactionAborted,
    TransactionHooks,
    Transactions,
    classify,
    guard_limit,
)
from tokenmill.watchdog import Overdue, Watchdog, overdue

pytestmark = pytest.mark.broker


class Boom(RuntimeError):
    pass


class FailAt(TransactionHooks):
    """Fails at one step, after pushing what was produced to the broker (so
    the abort has something real to discard)."""

    def __init__(self, step: str) -> None:
        self.at = step
        self.seen: list[str] = []

    def step(self, name, transaction, producer):  # type: ignore[no-untyped-def]
        self.seen.append(name)
        if name == self.at:
            producer.flush(10)
            raise Boom(f"injected at {name}")


def _transactions(settings, hooks: TransactionHooks | None = None) -> Transactions:
    txn_id = f"test.{uuid.uuid4().hex[:8]}"
    producer = clients.transactional_producer(settings, txn_id)
    producer.init_transactions(30)
    return Transactions(producer, transactional_id=txn_id, timeout_s=20,
                        hooks=hooks or TransactionHooks())


def _group_consumer(settings, topic: str, group: str):
    consumer = clients.consumer(settings, group, {"group.protocol": "consumer"})
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment():
        consumer.consume(10, 0.2)
        assert time.monotonic() < deadline, "no assignment"
    return consumer


# -- pure pieces ---------------------------------------------------------------

@pytest.mark.parametrize(("code", "fatal", "abortable", "retriable", "verdict"), [
    (KafkaError._FENCED, True, False, False, "fatal"),
    (KafkaError.PRODUCER_FENCED, False, False, False, "fatal"),
    (KafkaError.INVALID_PRODUCER_EPOCH, False, True, False, "fatal"),
    (KafkaError.CONCURRENT_TRANSACTIONS, False, False, True, "retry"),
    (KafkaError.COORDINATOR_NOT_AVAILABLE, False, False, True, "retry"),
    (KafkaError.ILLEGAL_GENERATION, False, True, False, "abort"),
    (KafkaError._TIMED_OUT, False, True, True, "fatal"),  # a fresh process, not a late answer
    (KafkaError.UNKNOWN_MEMBER_ID, False, False, False, "abort"),
    (KafkaError._STATE, True, False, False, "fatal"),
])
def test_classify(code, fatal, abortable, retriable, verdict) -> None:
    error = KafkaError(code, "x", fatal=fatal, retriable=retriable, txn_requires_abort=abortable)
    assert classify(error) == verdict


def test_watchdog_rules() -> None:
    assert overdue(100.0, {}, last_beat=95.0, stall_s=10) is None
    assert overdue(100.0, {}, last_beat=80.0, stall_s=10) == Overdue("the service loop", 20.0, 10)
    # inside a guarded call the loop may not beat; the call's own limit applies
    assert overdue(100.0, {1: ("commit", 95.0, 30.0)}, last_beat=0.0, stall_s=10) is None
    assert overdue(100.0, {1: ("commit", 60.0, 30.0)}, last_beat=99.0, stall_s=10) == Overdue(
        "commit", 40.0, 30.0)


def test_watchdog_fires_on_a_call_past_its_limit() -> None:
    fired: list[Overdue] = []
    dog = Watchdog("test", stall_s=60, check_s=0.02, on_overdue=fired.append).start()
    try:
        with dog.guard("a stuck call", 0.1):
            deadline = time.monotonic() + 10
            while not fired and time.monotonic() < deadline:
                time.sleep(0.01)  # poll of a wait loop
    finally:
        dog.stop()
    assert fired and fired[0].what == "a stuck call" and fired[0].blocked_s > 0.1


def test_a_send_offsets_call_past_its_own_timeout_is_the_known_hang() -> None:
    """librdkafka #5456/#5511: the watchdog ends it just past its timeout
    (10 s at most), not after the doubled limit the other steps get."""
    assert guard_limit("send_offsets_to_transaction", 30.0) == 15.0
    assert guard_limit("send_offsets_to_transaction", 6.0) == 11.0
    assert guard_limit("commit_transaction", 30.0) == 70.0
    assert guard_limit("abort_transaction", 20.0) == 50.0


def test_backoff_grows_to_its_cap() -> None:
    backoff = Backoff(first_s=0.1, cap_s=1.0)
    assert [backoff.delay(a) for a in (1, 2, 3, 4, 5)] == [0.1, 0.2, 0.4, 0.8, 1.0]


# -- against the broker -----------------------------------------------------------

def test_commit_makes_records_and_offsets_visible_together(settings) -> None:
    src, out = f"src.{uuid.uuid4().hex[:8]}", f"out.{uuid.uuid4().hex[:8]}"
    create_topic(settings.bootstrap_servers, src, 1)
    create_topic(settings.bootstrap_servers, out, 1)
    group = f"g.{uuid.uuid4().hex[:8]}"
    consumer = _group_consumer(settings, src, group)
    txns = _transactions(settings)
    try:
        with txns.transaction(lambda: [GroupOffsets([TopicPartition(src, 0, 7)],
                                                    consumer.consumer_group_metadata)]) as txn:
            for i in range(5):
                txn.produce(out, b"v%d" % i, key=b"k")
    finally:
        consumer.close()
    assert [r.value for r in read_all(settings.bootstrap_servers, out)] == [
        b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert committed_offsets(settings.bootstrap_servers, group, src) == {0: 7}


@pytest.mark.parametrize("step", ["begin", "produced", "offsets_sent", "committing"])
def test_a_failure_at_any_step_aborts_and_nothing_is_visible(settings, step) -> None:
    src, out = f"src.{uuid.uuid4().hex[:8]}", f"out.{uuid.uuid4().hex[:8]}"
    create_topic(settings.bootstrap_servers, src, 1)
    create_topic(settings.bootstrap_servers, out, 1)
    group = f"g.{uuid.uuid4().hex[:8]}"
    consumer = _group_consumer(settings, src, group)
    hooks = FailAt(step)
    txns = _transactions(settings, hooks)
    try:
        with pytest.raises(TransactionAborted, match=f"injected at {step}"):
            with txns.transaction(lambda: [GroupOffsets([TopicPartition(src, 0, 3)],
                                                        consumer.consumer_group_metadata)]) as txn:
                txn.produce(out, b"lost")
        assert hooks.seen[-1] == "aborted"
        # the producer is usable again: the next transaction commits
        hooks.at = "never"
        with txns.transaction() as txn:
            txn.produce(out, b"kept")
    finally:
        consumer.close()
    assert [r.value for r in read_all(settings.bootstrap_servers, out)] == [b"kept"]
    if step != "begin":  # the aborted record did reach the log: read_uncommitted sees it
        assert b"lost" in [r.value for r in read_all(settings.bootstrap_servers, out,
                                                     committed_only=False)]
    assert committed_offsets(settings.bootstrap_servers, group, src) == {0: None}


def test_a_fenced_producer_ends_as_kafka_fatal(settings) -> None:
    out = f"out.{uuid.uuid4().hex[:8]}"
    create_topic(settings.bootstrap_servers, out, 1)
    txns = _transactions(settings)
    newer = clients.transactional_producer(settings, txns.transactional_id)
    newer.init_transactions(30)  # takes the transactional id over
    with pytest.raises(KafkaFatal, match="another process took over"):
        with txns.transaction() as txn:
            txn.produce(out, b"zombie")
    assert read_all(settings.bootstrap_servers, out) == []


def test_stale_group_metadata_fences_a_zombie_member(settings) -> None:
    """A member that lost its partitions (here: it left the group) must not
    commit offsets for them: the group coordinator refuses the stale
    member's offsets (not any other failure), the transaction aborts, and
    nothing is visible."""
    src, out = f"src.{uuid.uuid4().hex[:8]}", f"out.{uuid.uuid4().hex[:8]}"
    create_topic(settings.bootstrap_servers, src, 1)
    create_topic(settings.bootstrap_servers, out, 1)
    group = f"g.{uuid.uuid4().hex[:8]}"
    zombie = _group_consumer(settings, src, group)
    stale = zombie.consumer_group_metadata()
    zombie.close()
    successor = _group_consumer(settings, src, group)
    txns = _transactions(settings)
    try:
        with pytest.raises(TransactionAborted, match=STALE_MEMBER):
            with txns.transaction(lambda: [GroupOffsets([TopicPartition(src, 0, 5)],
                                                        lambda: stale)]) as txn:
                txn.produce(out, b"zombie result")
    finally:
        successor.close()
    assert read_all(settings.bootstrap_servers, out) == []
    assert committed_offsets(settings.bootstrap_servers, group, src) == {0: None}


class FreezeBrokerAt(TransactionHooks):
    """Freezes the broker (SIGSTOP) for `frozen_s` at one step, then fails
    that step: the abort that follows meets a broker that does not answer."""

    def __init__(self, step: str, broker_pid: int, frozen_s: float) -> None:
        self.at, self.broker_pid, self.frozen_s = step, broker_pid, frozen_s
        self.seen: list[str] = []
        self.thaw: threading.Timer | None = None

    def step(self, name, transaction, producer):  # type: ignore[no-untyped-def]
        self.seen.append(name)
        if name == self.at:
            producer.flush(10)
            os.kill(self.broker_pid, signal.SIGSTOP)
            self.thaw = threading.Timer(self.frozen_s, os.kill,
                                        (self.broker_pid, signal.SIGCONT))
            self.thaw.start()
            raise Boom(f"injected at {name}")


def test_an_abort_that_outlasts_its_timeout_is_resumed_not_fatal(private_stack) -> None:
    """The broker stops answering for longer than one abort may wait (3 s)
    but less than ABORT_ATTEMPTS of them: the abort is resumed, nothing of the
    transaction is visible, and the producer commits the next one. (Before,
    the first timed-out abort was KafkaFatal and the worker exited.)"""
    stack = private_stack()
    settings = stack.settings()
    out = f"out.{uuid.uuid4().hex[:8]}"
    create_topic(stack.bootstrap, out, 1)
    broker_pid = stack.broker(1).pid
    hooks = FreezeBrokerAt("produced", broker_pid, frozen_s=5.0)
    txn_id = f"test.{uuid.uuid4().hex[:8]}"
    producer = clients.transactional_producer(settings, txn_id)
    producer.init_transactions(30)
    txns = Transactions(producer, transactional_id=txn_id, timeout_s=3, hooks=hooks)
    assert ABORT_ATTEMPTS * txns.timeout_s > hooks.frozen_s > txns.timeout_s
    started = time.monotonic()
    try:
        with pytest.raises(TransactionAborted, match="injected at produced"):
            with txns.transaction() as txn:
                txn.produce(out, b"lost")
        aborted_after = time.monotonic() - started
        hooks.at = "never"
        txns.timeout_s = 20
        with txns.transaction() as txn:
            txn.produce(out, b"kept")
    finally:
        if hooks.thaw is not None:
            hooks.thaw.join()
        os.kill(broker_pid, signal.SIGCONT)
    # one abort call waits 3 s: ending as an abort after the 5 s freeze took a resume
    assert aborted_after >= hooks.frozen_s - 0.5, aborted_after
    assert hooks.seen == ["begin", "produced", "aborted", "begin", "produced", "offsets_sent",
                          "committing", "committed"]
    assert [r.value for r in read_all(stack.bootstrap, out)] == [b"kept"]
    assert b"lost" in [r.value for r in read_all(stack.bootstrap, out, committed_only=False)]


class FreezeBrokerUntilThawed(TransactionHooks):
    """Freezes the broker (SIGSTOP) at one step and fails that step; the test
    thaws it (SIGCONT) only after the transactions gave their verdict."""

    def __init__(self, step: str, broker_pid: int) -> None:
        self.at, self.broker_pid = step, broker_pid
        self.seen: list[str] = []

    def step(self, name, transaction, producer):  # type: ignore[no-untyped-def]
        self.seen.append(name)
        if name == self.at:
            producer.flush(10)
            os.kill(self.broker_pid, signal.SIGSTOP)
            raise Boom(f"injected at {name}")


class CountingAborts:
    """The producer, with its `abort_transaction` calls counted (every other
    attribute is the producer's own)."""

    def __init__(self, producer) -> None:  # type: ignore[no-untyped-def]
        self._producer = producer
        self.aborts = 0

    def abort_transaction(self, *args):  # type: ignore[no-untyped-def]
        self.aborts += 1
        return self._producer.abort_transaction(*args)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._producer, name)


def test_an_abort_that_times_out_three_times_ends_as_kafka_fatal(private_stack) -> None:
    """The broker stops answering at a step and never comes back while the
    abort runs: the abort is called ABORT_ATTEMPTS times, each waiting its
    timeout, and then the transactions end as KafkaFatal with one line
    saying the abort could not finish (the process exits on it and restarts
    from committed state)."""
    stack = private_stack()
    settings = stack.settings()
    out = f"out.{uuid.uuid4().hex[:8]}"
    create_topic(stack.bootstrap, out, 1)
    broker_pid = stack.broker(1).pid
    hooks = FreezeBrokerUntilThawed("produced", broker_pid)
    txn_id = f"test.{uuid.uuid4().hex[:8]}"
    raw = clients.transactional_producer(settings, txn_id)
    raw.init_transactions(30)
    producer = CountingAborts(raw)
    txns = Transactions(producer, transactional_id=txn_id, timeout_s=2,  # type: ignore[arg-type]
                        hooks=hooks)
    started = time.monotonic()
    try:
        with pytest.raises(KafkaFatal) as fatal:
            with txns.transaction() as txn:
                txn.produce(out, b"lost")
        gave_up_after = time.monotonic() - started
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    message = str(fatal.value)
    assert "\n" not in message
    assert message.startswith(f"could not abort a transaction of {txn_id}"), message
    assert producer.aborts == ABORT_ATTEMPTS
    # every attempt waited out its timeout: it was the broker, not a refusal
    assert gave_up_after >= ABORT_ATTEMPTS * txns.timeout_s - 0.5, gave_up_after
    assert hooks.seen == ["begin", "produced"]  # never "aborted": the abort did not finish
    assert read_all(stack.bootstrap, out) == []
