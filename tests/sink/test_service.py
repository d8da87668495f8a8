"""The sink service in-process against the real broker and S3 server: what
lands in S3, the counters, pinning to an earlier object, and a zombie writer
beating the sink to a key."""

from __future__ import annotations

import urllib.request

import boto3
import msgspec
import pytest

from devstack.processes import free_port
from schemas import TrainingSample
from sink import object_keys
from sink.metrics import SinkMetrics
from sink.samples import encode_line, to_sample
from tests.kafka_helpers import committed_offsets, read_all
from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_bucket,
    create_run,
    feed,
    good,
    make_spec,
    publish_done,
    run_sink_in_process,
    s3_client,
    s3_objects,
    variant,
)
from tokenmill.kafka import topics
from tokenmill.progress import read_run_progress

pytestmark = [pytest.mark.broker, pytest.mark.s3]


def test_samples_objects_keys_and_counters(settings, run_id) -> None:
    spec = make_spec(run_id, partitions=3, bucket=settings.s3_bucket, compression="zstd")
    create_run(settings, spec)
    kinds = ["good"] * 5 + ["tool_call", "trivial"]
    records = [variant(spec, i, kinds[i % len(kinds)]) for i in range(70)]
    total = feed(settings, spec, records)
    publish_done(settings, run_id, total)
    service = run_sink_in_process(settings, spec, batch_size=8)

    by_id = {r.id: r for r in records}
    _, in_dlq = assert_exactly_once(settings, run_id, set(by_id))
    assert len(in_dlq) == 10
    completions = {(r.partition, r.offset): r for r in
                   read_all(settings.bootstrap_servers, topics.completions_topic(run_id))}
    for obj in s3_objects(settings):
        key = object_keys.parse_key(obj.key)
        assert (key.prefix, key.run, key.compression) == ("out/", run_id, "zstd")
        first, last = int(obj.metadata["first-offset"]), int(obj.metadata["last-offset"])
        assert key.first_offset == first and (key.partition, first) in completions
        assert int(obj.metadata["records"]) == len(obj.lines) <= 8
        assert obj.metadata["settings-hash"] == spec.settings_hash
        for line in obj.lines:
            sample = msgspec.convert(line, TrainingSample)
            assert sample == to_sample(by_id[sample.id])  # type: ignore[arg-type]
            assert encode_line(sample) == encode_line(to_sample(by_id[sample.id]))  # type: ignore[arg-type]
            assert int(sample.id[1:]) % 3 == key.partition
        # The object's range is exactly the records between its offsets.
        ids_in_range = {completions[(key.partition, o)].key.decode()
                        for o in range(first, last + 1) if (key.partition, o) in completions}
        assert {line["id"] for line in obj.lines} <= ids_in_range
    progress = read_run_progress(settings, run_id)
    assert progress.sink_done and progress.persisted == total
    mine = progress.sinks["inproc"]
    assert (mine.s3_records, mine.dlq_records) == (60, 10)
    assert mine.dlq_by_reason == {"trivial": 10}
    assert mine.s3_objects == len(s3_objects(settings))
    assert service.progress == mine
    # Committed offsets: after each partition's last record, never counted.
    last_offsets = {}
    for partition, offset in completions:
        last_offsets[partition] = max(offset, last_offsets.get(partition, -1))
    committed = committed_offsets(settings.bootstrap_servers, topics.sink_group(run_id),
                                  topics.completions_topic(run_id))
    assert committed == {p: o + 1 for p, o in last_offsets.items()}
    registry = service.metrics.registry
    assert registry.get_sample_value("tokenmill_sink_records_in_total") == total
    assert registry.get_sample_value("tokenmill_sink_s3_records_total") == 60
    assert registry.get_sample_value("tokenmill_sink_dlq_records_total",
                                     {"reason": "trivial"}) == 10
    assert registry.get_sample_value("tokenmill_sink_objects_total") == mine.s3_objects


def _offsets(settings, run_id, partition):
    return sorted(r.offset for r in read_all(settings.bootstrap_servers,
                                             topics.completions_topic(run_id))
                  if r.partition == partition)


def test_first_batch_is_pinned_to_an_earlier_owners_object(settings, run_id) -> None:
    """An earlier owner uploaded [f, 5th record] and crashed before its commit;
    with batch size 2 the replay would otherwise write 2 records to that key."""
    spec = make_spec(run_id, partitions=1)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(12)]
    publish_done(settings, run_id, feed(settings, spec, records, per_transaction=3))
    offsets = _offsets(settings, run_id, 0)
    create_bucket(settings)
    key = object_keys.object_key("", run_id, 0, offsets[0])
    s3_client(settings).put_object(
        Bucket=settings.s3_bucket, Key=key,
        Body=b"".join(encode_line(to_sample(r)) for r in records[:5]),
        Metadata={"first-offset": str(offsets[0]), "last-offset": str(offsets[4]),
                  "records": "5"})
    run_sink_in_process(settings, spec, batch_size=2)

    assert_exactly_once(settings, run_id, {r.id for r in records})
    objects = {o.key: o for o in s3_objects(settings)}
    assert [line["id"] for line in objects[key].lines] == [r.id for r in records[:5]]
    assert objects[key].metadata["last-offset"] == str(offsets[4])
    assert all(len(o.lines) <= 2 for k, o in objects.items() if k != key)


def test_a_zombie_writer_first_at_the_key_makes_the_sink_replay_pinned(settings, run_id) -> None:
    """Two owners of one partition (a zombie and this sink) both probed an
    empty key; the zombie's write lands first with fewer records. The sink's
    conditional write fails, it rewinds, pins to the zombie's range and
    replays: nothing is lost or written twice."""
    spec = make_spec(run_id, partitions=1)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(9)]
    publish_done(settings, run_id, feed(settings, spec, records, per_transaction=4))
    offsets = _offsets(settings, run_id, 0)
    create_bucket(settings)
    zombie_key = object_keys.object_key("", run_id, 0, offsets[0])
    zombie = s3_client(settings)
    client = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    puts: list[str] = []

    def zombie_writes_first(params, **_kwargs) -> None:
        puts.append(params["Key"])
        if params["Key"] == zombie_key and len(puts) == 1:
            assert params.get("IfNoneMatch") == "*"
            zombie.put_object(
                Bucket=settings.s3_bucket, Key=zombie_key,
                Body=b"".join(encode_line(to_sample(r)) for r in records[:2]),
                Metadata={"first-offset": str(offsets[0]), "last-offset": str(offsets[1]),
                          "records": "2"})

    client.meta.events.register("before-parameter-build.s3.PutObject", zombie_writes_first)
    service = run_sink_in_process(settings, spec, batch_size=4, s3_client=client)

    assert_exactly_once(settings, run_id, {r.id for r in records})
    objects = {o.key: o for o in s3_objects(settings)}
    assert [line["id"] for line in objects[zombie_key].lines] == [r.id for r in records[:2]]
    assert service.metrics.registry.get_sample_value("tokenmill_sink_conflicts_total") == 1
    assert puts.count(zombie_key) == 2  # the lost conditional write, then the pinned replay


def test_metrics_endpoint_serves_the_private_registry() -> None:
    metrics = SinkMetrics()
    metrics.records_in.inc(3)
    port = free_port()
    server = metrics.serve(port, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
    assert "tokenmill_sink_records_in_total 3.0" in text
    assert "python_gc" not in text  # a private registry, not the global one


