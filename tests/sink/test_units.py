"""The pure pieces, without Kafka or S3: keys, batches and rotation, samples,
dead letters, counters, object bodies and metadata, configuration."""

from __future__ import annotations

import io
import itertools

import msgspec
import pytest
import zstandard
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from schemas import DeadLetter, Failure, Message, SinkProgress, TrainingSample, encode_record
from schemas.dlq import HEADER_OFFSET, HEADER_PARTITION, HEADER_REASON
from sink import counters, dlq, object_keys, objects
from sink.batcher import (
    BatchLimits,
    DeadLetterOut,
    ExistingObject,
    OffsetOrderError,
    PartitionBatcher,
)
from sink.config import parse_size, resolve
from sink.routing import dlq_reason, facts_of, view_facts
from sink.samples import (
    LineEncoder,
    decode_line,
    decode_view,
    encode_line,
    raw_text_present,
    sample_line,
    to_sample,
    view_line,
)
from tests.sink.sink_helpers import good, make_spec, variant
from tokenmill.settings import Settings

# -- object keys -----------------------------------------------------------------

offsets = st.integers(min_value=0, max_value=2**63 - 1)
partitions = st.integers(min_value=0, max_value=9999)


@given(a=offsets, b=offsets, p=partitions)
def test_keys_sort_like_their_offsets(a: int, b: int, p: int) -> None:
    ka, kb = object_keys.object_key("x/", "run", p, a), object_keys.object_key("x/", "run", p, b)
    assert (ka < kb) == (a < b) and (ka == kb) == (a == b)
    assert len(ka) == len(kb)  # zero padded: fixed width


@given(offset=offsets, p=partitions, prefix=st.sampled_from(["", "a", "a/", "/a/b/", "a/b"]),
       compression=st.sampled_from(["none", "zstd"]))
def test_keys_depend_only_on_run_partition_offset_and_parse_back(
        offset: int, p: int, prefix: str, compression: str) -> None:
    key = object_keys.object_key(prefix, "run-1", p, offset, compression)  # type: ignore[arg-type]
    parsed = object_keys.parse_key(key)
    assert (parsed.run, parsed.partition, parsed.first_offset, parsed.compression) == (
        "run-1", p, offset, compression)
    assert parsed.prefix == object_keys.normalize_prefix(prefix)
    assert f"/partition={p:04d}/offset={offset:020d}.jsonl" in "/" + key
    assert key in object_keys.candidate_keys(prefix, "run-1", p, offset)


def test_key_layout_example() -> None:
    assert object_keys.object_key("datasets", "r1", 3, 1500, "zstd") == (
        "datasets/r1/partition=0003/offset=00000000000000001500.jsonl.zst")
    with pytest.raises(ValueError):
        object_keys.object_key("", "r1", 0, -1)


# -- batches and rotation -------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def letter(reason: str = "trivial", size: int = 10) -> DeadLetterOut:
    return DeadLetterOut(key=b"k", value=b"x" * size, headers=[], reason=reason)


steps = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=3),  # offset gap (markers take slots)
        st.integers(min_value=1, max_value=400),  # record bytes
        st.booleans(),  # dead letter?
        st.sampled_from([0.0, 0.0, 0.0, 1.0, 7.0]),  # clock advance before the record
    ),
    max_size=200,
)


@hsettings(max_examples=150, deadline=None)
@given(steps=steps, max_records=st.integers(1, 20), max_bytes=st.integers(1, 3000),
       max_age=st.sampled_from([5.0, 30.0]))
def test_rotation_partitions_records_into_contiguous_bounded_batches(
        steps, max_records: int, max_bytes: int, max_age: float) -> None:
    clock = FakeClock()
    limits = BatchLimits(max_records=max_records, max_bytes=max_bytes, max_age_s=max_age)
    batcher = PartitionBatcher(0, limits, clock)
    batcher.set_existing(())
    offset, sizes = -1, {}
    for gap, size, is_dead, advance in steps:
        clock.now += advance
        batcher.tick()
        offset += gap
        sizes[offset] = size
        if is_dead:
            fired = batcher.add(offset, dead_letter=letter(size=size))
        else:
            fired = batcher.add(offset, line=b"y" * size)
        assert fired in (None, "count", "bytes")
    batcher.drain()
    assert batcher.current is None
    covered = []
    for batch in batcher.sealed:
        assert batch.records == batch.line_count + len(batch.dead_letters)
        assert batch.bytes == sum(s for o, s in sizes.items()
                                  if batch.first_offset <= o <= batch.last_offset)
        before_last = batch.bytes - sizes[batch.last_offset]
        # No predicate held before the last record went in ...
        assert batch.records - 1 < max_records and before_last < max_bytes
        # ... and the one named held after it.
        if batch.sealed_by == "count":
            assert batch.records == max_records
        elif batch.sealed_by == "bytes":
            assert batch.bytes >= max_bytes and batch.records < max_records
        else:
            assert batch.sealed_by in ("age", "drain")
            assert batch.records < max_records and batch.bytes < max_bytes
        assert batch.next_offset == batch.last_offset + 1
        covered.append((batch.first_offset, batch.last_offset, batch.records))
    # Every record in exactly one batch, in offset order.
    assert sum(r for _, _, r in covered) == len(sizes)
    for (f1, l1, _), (f2, _, _) in itertools.pairwise(covered):
        assert f1 <= l1 < f2
    if covered:
        assert covered[0][0] == min(sizes) and covered[-1][1] == max(sizes)


def test_each_predicate_names_itself() -> None:
    clock = FakeClock()
    batcher = PartitionBatcher(0, BatchLimits(max_records=3, max_bytes=100, max_age_s=10), clock)
    assert [batcher.add(o, line=b"a") for o in (0, 1, 2)] == [None, None, "count"]
    assert batcher.add(4, line=b"b" * 100) == "bytes"
    batcher.add(5, line=b"c")
    clock.now += 9.9
    assert batcher.tick() is None
    clock.now += 0.1
    assert batcher.tick() == "age"
    batcher.add(9, dead_letter=letter())
    assert batcher.drain() is True
    assert [b.sealed_by for b in batcher.sealed] == ["count", "bytes", "age", "drain"]
    assert [(b.first_offset, b.last_offset) for b in batcher.sealed] == [
        (0, 2), (4, 4), (5, 5), (9, 9)]


@hsettings(max_examples=100, deadline=None)
@given(n=st.integers(1, 60), pin_at=st.integers(0, 59), max_records=st.integers(1, 10))
def test_a_pinned_batch_ends_exactly_at_the_earlier_objects_last_offset(
        n: int, pin_at: int, max_records: int) -> None:
    pin_at = min(pin_at, n - 1)
    clock = FakeClock()
    batcher = PartitionBatcher(2, BatchLimits(max_records=max_records, max_age_s=1), clock)
    assert batcher.needs_probe
    offsets_ = [10 + 2 * i for i in range(n)]
    earlier = ExistingObject(key="k", etag="e", size=1, first_offset=10,
                             last_offset=offsets_[pin_at], records=pin_at + 1)
    batcher.set_existing((earlier,))
    for i, offset in enumerate(offsets_):
        clock.now += 5  # age would fire on every tick, count every few records
        assert batcher.tick() is None or i > pin_at
        fired = batcher.add(offset, line=b"z")
        if i < pin_at:
            assert fired is None
        elif i == pin_at:
            assert fired == "pinned"
    first = batcher.sealed[0]
    assert (first.first_offset, first.last_offset, first.sealed_by) == (10, offsets_[pin_at],
                                                                        "pinned")
    assert first.records == pin_at + 1
    # Only the first batch after the probe is pinned.
    assert all(b.existing == () for b in list(batcher.sealed)[1:])


def test_rewind_replays_from_the_oldest_uncommitted_batch() -> None:
    batcher = PartitionBatcher(0, BatchLimits(max_records=2), FakeClock())
    batcher.set_existing(())
    for offset in (3, 5, 7, 9, 11):
        batcher.add(offset, line=b"a")
    first = batcher.ready()
    assert first is not None and first.first_offset == 3
    batcher.committed(first)
    assert batcher.rewind() == 7
    assert batcher.idle and batcher.needs_probe
    # Records fetched before the seek took effect are skipped until offset 7.
    assert [batcher.accepts(o) for o in (9, 11, 7, 9)] == [False, False, True, True]
    batcher.set_existing(())
    batcher.add(7, line=b"a")
    with pytest.raises(OffsetOrderError):
        batcher.add(7, line=b"a")


def test_only_the_oldest_sealed_batch_can_be_committed() -> None:
    batcher = PartitionBatcher(0, BatchLimits(max_records=1), FakeClock())
    batcher.add(0, line=b"a")
    batcher.add(1, line=b"b")
    with pytest.raises(RuntimeError):
        batcher.committed(batcher.sealed[1])


def test_limits_are_validated() -> None:
    for bad in ({"max_records": 0}, {"max_bytes": 0}, {"max_age_s": 0}):
        with pytest.raises(ValueError):
            BatchLimits(**bad)  # type: ignore[arg-type]


# -- samples ---------------------------------------------------------------------------

texts = st.one_of(st.none(), st.text(max_size=300))


@hsettings(max_examples=100, deadline=None)
@given(i=st.integers(0, 10**6), content=texts, reasoning=texts,
       kind=st.sampled_from(["good", "tool_call", "length", "trivial"]))
def test_a_sample_line_is_one_self_contained_json_line(i: int, content, reasoning,
                                                        kind: str) -> None:
    spec = make_spec("r")
    record = msgspec.structs.replace(variant(spec, i, kind), content=content,
                                     reasoning_content=reasoning)
    line = sample_line(record)  # type: ignore[arg-type]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    sample = decode_line(line)
    assert sample == to_sample(record)  # type: ignore[arg-type]
    assert (sample.id, sample.run, sample.settings_hash) == (record.id, "r", spec.settings_hash)
    assert sample.messages == record.prompt.messages and sample.tools == record.prompt.tools
    assert (sample.completion.content, sample.completion.reasoning_content,
            sample.completion.tool_calls) == (content, reasoning, record.tool_calls)
    assert (sample.finish_reason, sample.usage, sample.spec, sample.model) == (
        record.finish_reason, record.usage, record.spec, record.model)
    assert (sample.source, sample.category) == (record.prompt.source, record.prompt.category)
    assert encode_line(sample) == line


tricky = st.text(alphabet=" \t\n\r\f\v\x00\x1c\x1f\x85\xa0\u2000\u2028\u3000xO.\"\\/é中😀",
                 max_size=40)
any_text = st.one_of(st.none(), tricky, st.text(max_size=200))


@hsettings(max_examples=300, deadline=None)
@given(text=any_text)
def test_raw_text_present_is_exactly_strip(text) -> None:
    raw = msgspec.Raw(msgspec.json.encode(text))
    assert raw_text_present(raw) == bool(text and text.strip())


@hsettings(max_examples=200, deadline=None)
@given(i=st.integers(0, 10**6), content=any_text, reasoning=any_text,
       kind=st.sampled_from(["good", "tool_call", "length", "trivial", "empty"]),
       system=st.one_of(st.none(), st.text(max_size=50)), tokens=st.integers(0, 10**5))
def test_the_hot_path_writes_the_same_line_and_routes_the_same(i, content, reasoning, kind,
                                                               system, tokens) -> None:
    spec = make_spec("r")
    record = variant(spec, i, kind)
    messages = record.prompt.messages
    if system is not None:
        messages = (Message(role="system", content=system), *messages[1:])
    record = msgspec.structs.replace(
        record, content=content, reasoning_content=reasoning,
        prompt=msgspec.structs.replace(record.prompt, messages=messages),
        usage=msgspec.structs.replace(record.usage, completion_tokens=tokens))
    view = decode_view(encode_record(record))
    assert view_line(view) == sample_line(record)  # type: ignore[arg-type]
    encoder = LineEncoder()
    assert encoder.line(view) == encoder.line(view) == view_line(view)
    assert view_facts(view) == facts_of(record)  # type: ignore[arg-type,union-attr]
    assert dlq_reason(view, spec) == dlq_reason(record, spec)
    assert decode_line(view_line(view)) == to_sample(record)  # type: ignore[arg-type]


def test_failures_decode_typed_on_the_hot_path() -> None:
    record = variant(make_spec("r"), 2, "failed")
    assert decode_view(encode_record(record)) == record


def test_sample_line_decodes_as_the_published_schema() -> None:
    line = sample_line(good(make_spec("r"), 5))
    assert isinstance(msgspec.json.decode(line, type=TrainingSample), TrainingSample)


# -- dead letters ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["failed", "length", "trivial"])
def test_dead_letter_envelope_keeps_the_record_byte_for_byte(kind: str) -> None:
    spec = make_spec("r")
    record = variant(spec, 8, kind)
    raw = encode_record(record)
    out = dlq.dead_letter(record, raw, reason=kind, detail="why", topic="t", partition=3,
                          offset=77)
    envelope = msgspec.json.decode(out.value, type=DeadLetter)
    assert envelope.record == record and raw in out.value
    assert (envelope.reason, envelope.detail, envelope.source_topic, envelope.source_partition,
            envelope.source_offset) == (kind, "why", "t", 3, 77)
    assert out.key == record.id.encode()
    headers = dict(out.headers)
    assert headers[HEADER_REASON] == kind.encode()
    assert (headers[HEADER_PARTITION], headers[HEADER_OFFSET]) == (b"3", b"77")
    assert isinstance(envelope.record, Failure) == (kind == "failed")


# -- counters ----------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3),
                          st.dictionaries(st.sampled_from(["length", "trivial"]),
                                          st.integers(0, 9))), max_size=20))
def test_counters_are_cumulative(flushes) -> None:
    progress = counters.start("r", "i", None)
    for records, objects_, reasons in flushes:
        progress = counters.plus(progress, s3_records=records, s3_objects=objects_,
                                 dlq_by_reason=reasons)
    assert progress.s3_records == sum(r for r, _, _ in flushes)
    assert progress.dlq_records == sum(sum(d.values()) for _, _, d in flushes)
    assert progress.dlq_records == sum(progress.dlq_by_reason.values())
    again = counters.start("r", "i", encode_record(progress))
    assert again == progress


def test_counters_refuse_another_instances_record() -> None:
    with pytest.raises(ValueError):
        counters.start("r", "i", encode_record(SinkProgress(run="r", instance="other")))


# -- object bodies and metadata -----------------------------------------------------------


def test_body_and_metadata_describe_the_batch() -> None:
    batcher = PartitionBatcher(4, BatchLimits(max_records=3), FakeClock())
    batcher.add(10, line=b'{"a":1}\n')
    batcher.add(12, dead_letter=letter())
    batcher.add(13, line=b'{"a":2}\n')
    batch = batcher.sealed[0]
    plain = objects.body(batch.lines, "none")
    assert plain == b'{"a":1}\n{"a":2}\n'
    packed = objects.body(batch.lines, "zstd")
    assert zstandard.ZstdDecompressor().stream_reader(io.BytesIO(packed)).read() == plain
    meta = objects.metadata(batch, run="r", topic="t", settings_hash="h")
    assert meta["first-offset"] == "10" and meta["last-offset"] == "13"
    assert meta["records"] == "2" and meta["batch-records"] == "3"
    assert all(isinstance(v, str) and v.isascii() for v in meta.values())
    found = objects.existing("k", '"e"', 5, meta)
    assert (found.first_offset, found.last_offset, found.records) == (10, 13, 2)
    with pytest.raises(objects.ForeignObject):
        objects.existing("k", '"e"', 5, {})


# -- configuration --------------------------------------------------------------------------


def test_parse_size() -> None:
    assert parse_size("64MiB") == 64 * 1024 * 1024
    assert parse_size("512k") == 512_000
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError):
        parse_size("lots")


def test_destination_precedence_flags_env_over_spec() -> None:
    spec = make_spec("r", bucket="spec-bucket", compression="zstd")
    limits = BatchLimits()
    from_spec = resolve(Settings(), spec, instance="i", compression=None, create_bucket=None,
                        limits=limits)
    assert (from_spec.bucket, from_spec.prefix, from_spec.compression) == (
        "spec-bucket", "out/", "zstd")
    assert from_spec.create_bucket is False  # AWS: never implicitly
    assert from_spec.transactional_id == "tokenmill.r.sink.i"
    override = resolve(Settings(s3_bucket="b", s3_prefix="p", s3_endpoint_url="http://127.0.0.1:9"),
                       spec, instance="i", compression="none", create_bucket=None,
                       limits=limits)
    assert (override.bucket, override.prefix, override.compression) == ("b", "p/", "none")
    assert override.create_bucket is True  # loopback endpoint
    from sink.errors import SinkError

    with pytest.raises(SinkError, match="no S3 bucket"):
        resolve(Settings(), make_spec("r"), instance="i", compression=None, create_bucket=None,
                limits=limits)


def test_dead_letter_wire_mirrors_the_schema() -> None:
    """The sink encodes dead letters through a raw-record twin of
    schemas.DeadLetter: the two must keep the same fields in the same order."""
    from sink.dlq import _DeadLetterWire

    assert _DeadLetterWire.__struct_fields__ == DeadLetter.__struct_fields__
