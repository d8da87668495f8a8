"""Which failed reads of a group's committed offsets a member waits out
(tokenmill/kafka/start_offsets.py); the wait itself is shown on the broker
by tests/consumer/test_liveness.py and tests/sink/test_takeover.py."""

from __future__ import annotations

from confluent_kafka import KafkaError

from tokenmill.kafka.start_offsets import waited_out


def test_a_read_that_ran_out_of_time_is_tried_again() -> None:
    # held by an undecided transaction
    assert waited_out(KafkaError(KafkaError._TIMED_OUT))
    # never left the client's queue in time (ci41: a worker exited on it)
    assert waited_out(KafkaError(KafkaError._TIMED_OUT_QUEUE))


def test_other_failures_are_the_callers() -> None:
    assert not waited_out(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    assert not waited_out(KafkaError(KafkaError._UNKNOWN_PARTITION))
    assert not waited_out(RuntimeError("not a Kafka error"))
    assert not waited_out(None)
