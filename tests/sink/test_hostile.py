"""Hostile records in `.completions` never stop the sink: each goes to the
dead-letter topic once, with reason `invalid`, its key and value as read
(bytes-safe) and its position; every real completion still lands in exactly
one place, and the run finishes. A hostile record inside an aborted
transaction is never seen at all."""

from __future__ import annotations

import msgspec
import pytest
from confluent_kafka import Producer

from schemas import DeadLetter
from schemas.dlq import HEADER_OFFSET, HEADER_REASON
from tests.sink.sink_helpers import (
    create_run,
    dlq_records,
    feed,
    good,
    make_spec,
    publish_done,
    run_sink_in_process,
    s3_ids,
)
from tokenmill.kafka import topics

pytestmark = [pytest.mark.broker, pytest.mark.s3]


def _hostile(spec, other_run_spec) -> dict[str, bytes | None]:
    stranger = msgspec.structs.replace(good(spec, 900), settings_hash="0" * 16)
    foreign = good(other_run_spec, 901)
    return {
        "not-json": b"\xff\xfe not json at all \x00",
        "wrong-shape": b'{"kind": "completion", "id": 42}',
        "json-array": b'[1, 2, 3]',
        "null-value": None,
        "oversized": b"x" * (3 * 1024 * 1024),
        "other-settings": msgspec.json.encode(stranger),
        "other-run": msgspec.json.encode(foreign),
    }


def _produce_raw(settings, run_id: str, items: dict[str, bytes | None], *,
                 abort: bool = False) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                         "transactional.id": f"hostile-{run_id}-{abort}",
                         "message.max.bytes": topics.MAX_MESSAGE_BYTES})
    producer.init_transactions(30)
    producer.begin_transaction()
    for name, value in items.items():
        producer.produce(topics.completions_topic(run_id), key=name.encode(), value=value,
                         partition=0)
    if abort:
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(30)


def test_hostile_records_are_dead_lettered_once_and_the_run_goes_on(settings, run_id) -> None:
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(40)]
    feed(settings, spec, records[:20], with_aborted=False)
    hostile = _hostile(spec, make_spec("someone-else", partitions=2))
    _produce_raw(settings, run_id, {f"aborted-{k}": v for k, v in hostile.items()}, abort=True)
    _produce_raw(settings, run_id, hostile)
    feed(settings, spec, records[20:], with_aborted=False)
    publish_done(settings, run_id, len(records))

    service = run_sink_in_process(settings, spec, batch_size=8)

    letters = dlq_records(settings, run_id)
    invalid = [r for r in letters if dict(r.headers)[HEADER_REASON] == b"invalid"]
    assert sorted(r.key for r in invalid) == sorted(k.encode() for k in hostile)
    for record in invalid:
        envelope = msgspec.json.decode(record.value, type=DeadLetter)
        name = record.key.decode()
        assert envelope.reason == "invalid" and envelope.record is None
        assert envelope.raw is not None and envelope.raw.key == record.key
        assert str(envelope.raw.offset).encode() == dict(record.headers)[HEADER_OFFSET]
        original = hostile[name]
        if original is None:
            assert envelope.raw.value is None and envelope.raw.size == -1
        else:
            assert envelope.raw.size == len(original)
            assert original.startswith(envelope.raw.value or b"")
            assert envelope.raw.truncated == (name == "oversized")
    # every real completion (all good ones) is in S3 once; nothing else is in
    # the DLQ, and nothing of the aborted transaction anywhere
    assert len(letters) == len(hostile)
    in_s3 = s3_ids(settings)
    assert len(in_s3) == len(set(in_s3)) and set(in_s3) == {r.id for r in records}
    progress = service.progress
    assert progress.dlq_by_reason.get("invalid") == len(hostile)
    assert progress.s3_records == len(records)
