"""Hostile records in the prompts topic never stop or poison a run: each is
dead-lettered once (reason `invalid`, its key and value as read, its
position), every real prompt ends in S3 or the DLQ exactly once, and the run
finishes. Worker and sink on the real broker; checked with kafka-python."""

from __future__ import annotations

import msgspec
import pytest
from confluent_kafka import Producer

from schemas import DeadLetter, Failure
from schemas.dlq import HEADER_REASON
from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import (
    ConsumerProcess,
    consumer_progress,
    create_run,
    make_prompts,
    publish,
)
from tests.sink.sink_helpers import dlq_records, run_sink_in_process, s3_ids
from tokenmill.kafka import topics

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow]

FAST = SimulatorConfig(zero_delay=True, length_median=40, length_sigma=0.3, length_max=120)


def _hostile(run_id: str, prompts) -> dict[str, bytes | None]:
    foreign = msgspec.structs.replace(prompts[3], run="someone-else")  # a colliding id
    return {
        "not-json": b"\xff\xfe{not json",
        "wrong-shape": b'{"id": 1, "messages": "hello"}',
        "json-array": b'["a", "b"]',
        "null-value": None,
        "oversized": b"{" + b" " * (5 * 1024 * 1024),
        "other-run": msgspec.json.encode(foreign),
        "no-messages": msgspec.json.encode(msgspec.structs.replace(prompts[4], id="empty",
                                                                   messages=())),
    }


def _produce(settings, run_id: str, items: dict[str, bytes | None], *, abort: bool) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                         "transactional.id": f"hostile-{run_id}-{abort}",
                         "message.max.bytes": topics.MAX_MESSAGE_BYTES})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, (name, value) in enumerate(items.items()):
        producer.produce(topics.prompts_topic(run_id), key=name.encode(), value=value,
                         partition=i % 2)
    (producer.abort_transaction if abort else producer.commit_transaction)(30)


def test_hostile_prompt_records_are_dead_lettered_and_the_run_finishes(settings, run_id,
                                                                       tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=2)
    prompts = make_prompts(run_id, 120)
    hostile = _hostile(run_id, prompts)
    # first in their partitions: the worst place (every restart meets them first)
    _produce(settings, run_id, {f"aborted-{k}": v for k, v in hostile.items()}, abort=True)
    _produce(settings, run_id, hostile, abort=False)
    publish(settings, spec, prompts)  # ends with the producer's done checkpoint
    with running_simulator(FAST) as url:
        worker = ConsumerProcess(settings, run_id, url, "w", tmp_path, "--until-done").start()
        try:
            assert worker.wait(120) == 0, worker.log()[-3000:]
        finally:
            worker.stop()
    state = consumer_progress(settings, run_id)
    assert state.generated == len(prompts) and state.consumer_total("invalid") == len(hostile)
    assert len(worker.events("invalid prompt record; dead-lettered")) == len(hostile)

    run_sink_in_process(settings, spec, batch_size=20)

    letters = dlq_records(settings, run_id)
    invalid = [r for r in letters if dict(r.headers)[HEADER_REASON] == b"invalid"]
    assert len(invalid) == len(hostile)
    seen = {}
    details = {}
    for record in invalid:
        envelope = msgspec.json.decode(record.value, type=DeadLetter)
        failure = envelope.record
        assert isinstance(failure, Failure) and failure.failure == "invalid"
        assert failure.raw is not None and failure.raw.topic == topics.prompts_topic(run_id)
        seen[failure.raw.key.decode()] = failure.raw
        details[failure.raw.key.decode()] = envelope.detail
    assert set(seen) == set(hostile)
    for name, raw in seen.items():
        value = hostile[name]
        if value is None:
            assert raw.value is None
        else:
            assert raw.size == len(value) and value.startswith(raw.value or b"")
    assert seen["oversized"].truncated and not seen["not-json"].truncated
    assert "someone-else" in details["other-run"]
    assert "null value" in details["null-value"]
    # every real prompt exactly once in S3 or the DLQ; nothing of the aborted ones
    real = [r.key.decode() for r in letters if r not in invalid]
    everywhere = s3_ids(settings) + real
    assert sorted(everywhere) == sorted(p.id for p in prompts)
    assert not any(name.startswith("aborted-") for name in seen)
