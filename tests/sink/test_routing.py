"""Routing: every DLQ reason, the policy, and the DLQ records on the real topic."""

from __future__ import annotations

import msgspec
import pytest

from schemas import DeadLetter, decode_completion, encode_record
from schemas.dlq import (
    HEADER_DETAIL,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_TOPIC,
)
from sink.routing import completion_reasons, dlq_reason
from tests.kafka_helpers import read_all
from tests.sink.sink_helpers import (
    assert_exactly_once,
    create_run,
    dlq_records,
    feed,
    make_spec,
    publish_done,
    run_sink_in_process,
    variant,
)
from tokenmill.kafka import topics

KINDS = ("failed", "length", "empty", "trivial", "missing_reasoning")


@pytest.mark.parametrize("kind", KINDS)
def test_each_reason_is_found_and_routed(kind: str) -> None:
    spec = make_spec("r")
    assert dlq_reason(variant(spec, 1, kind), spec)[0] == kind  # type: ignore[index]


@pytest.mark.parametrize("kind", ["good", "tool_call"])
def test_good_records_and_tool_calls_go_to_s3(kind: str) -> None:
    spec = make_spec("r")
    assert dlq_reason(variant(spec, 1, kind), spec) is None


def test_reasons_not_in_the_policy_go_to_s3() -> None:
    spec = make_spec("r", dlq_reasons=["failed", "length"])
    for kind in ("empty", "trivial", "missing_reasoning"):
        assert dlq_reason(variant(spec, 1, kind), spec) is None
    assert dlq_reason(variant(spec, 1, "length"), spec)[0] == "length"  # type: ignore[index]


def test_failures_always_go_to_the_dlq() -> None:
    spec = make_spec("r", dlq_reasons=["length"])
    reason, detail = dlq_reason(variant(spec, 1, "failed"), spec)  # type: ignore[misc]
    assert reason == "failed"
    assert "prompt_too_long" in detail and "HTTP 400" in detail


def test_priority_and_fallback_to_the_next_listed_reason() -> None:
    spec = make_spec("r")
    record = msgspec.structs.replace(variant(spec, 1, "trivial"), reasoning_content=None)
    assert [r for r, _ in completion_reasons(record, spec)] == ["trivial", "missing_reasoning"]
    only_reasoning = make_spec("r", dlq_reasons=["missing_reasoning"])
    assert dlq_reason(record, only_reasoning)[0] == "missing_reasoning"  # type: ignore[index]


def test_thinking_off_does_not_require_reasoning() -> None:
    spec = make_spec("r", enable_thinking=False)
    assert dlq_reason(variant(spec, 1, "missing_reasoning"), spec) is None


def test_trivial_threshold_counts_stripped_characters() -> None:
    spec = make_spec("r")
    base = variant(spec, 1, "good")
    for content, trivial in (("OK.", True), ("  Yes \n", True), ("Sure!", False),
                             ("", True), ("abcd", False)):
        record = msgspec.structs.replace(base, content=content)
        got = dlq_reason(record, spec)
        assert (got is not None and got[0] == "trivial") is trivial, content


def test_empty_needs_no_content_no_reasoning_no_tool_calls() -> None:
    spec = make_spec("r")
    tool = variant(spec, 1, "tool_call")
    assert dlq_reason(msgspec.structs.replace(tool, reasoning_content=None), spec) == (
        "missing_reasoning", "enable_thinking is on but no reasoning_content")
    blank = msgspec.structs.replace(variant(spec, 1, "good"), content="  ", reasoning_content="\n")
    assert dlq_reason(blank, spec)[0] == "empty"  # type: ignore[index]


@pytest.mark.broker
@pytest.mark.s3
def test_dlq_records_carry_reason_and_source_headers(settings, run_id) -> None:
    """Every reason end to end: DLQ records read back with kafka-python, the
    good ones in S3, each record in exactly one place."""
    spec = make_spec(run_id, partitions=2)
    create_run(settings, spec)
    kinds = ["good", "tool_call", *KINDS] * 3
    records = [variant(spec, i, kind) for i, kind in enumerate(kinds)]
    total = feed(settings, spec, records, per_transaction=4)
    publish_done(settings, run_id, total)
    run_sink_in_process(settings, spec, batch_size=5)

    in_s3, _ = assert_exactly_once(settings, run_id, {r.id for r in records})
    expected = {r.id: kind for r, kind in zip(records, kinds, strict=True)}
    assert sorted(in_s3) == sorted(i for i, k in expected.items() if k in ("good", "tool_call"))
    completions = {(r.partition, r.offset): r for r in
                   read_all(settings.bootstrap_servers, topics.completions_topic(run_id))}
    dead = dlq_records(settings, run_id)
    assert len(dead) == 3 * len(KINDS)
    for message in dead:
        headers = {k: v.decode() for k, v in message.headers}
        letter = msgspec.json.decode(message.value, type=DeadLetter)
        assert headers[HEADER_REASON] == letter.reason == expected[letter.id]
        assert headers[HEADER_DETAIL] == letter.detail and letter.detail
        assert headers[HEADER_TOPIC] == letter.source_topic == topics.completions_topic(run_id)
        partition, offset = int(headers[HEADER_PARTITION]), int(headers[HEADER_OFFSET])
        assert (partition, offset) == (letter.source_partition, letter.source_offset)
        source = completions[(partition, offset)]
        assert source.key.decode() == letter.id == message.key.decode()
        # The envelope holds the original record, byte for byte.
        assert encode_record(letter.record) == source.value
        assert letter.record == decode_completion(source.value)


def test_s3_lines_are_self_contained_samples_sanity() -> None:
    # Covered end to end in test_service; here only that a tool-call record keeps its tools.
    spec = make_spec("r")
    from sink.samples import to_sample

    sample = to_sample(variant(spec, 3, "tool_call"))  # type: ignore[arg-type]
    assert sample.tools and sample.completion.tool_calls and sample.category == "tools"

