"""ops/destination.py: the route a record takes and the S3 object that holds it."""

from __future__ import annotations

import socket
import time

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from ops.destination import (
    KeyFinder,
    Route,
    choose_key,
    describe_error,
    holds,
    route,
    s3_label,
)
from sink.object_keys import object_key
from tests.sink.sink_helpers import make_spec, variant
from tokenmill.settings import Settings

SPEC = make_spec("r")


@pytest.mark.parametrize("kind", ["failed", "length", "empty", "trivial", "missing_reasoning"])
def test_dead_letters_are_named_with_the_sinks_reason(kind: str) -> None:
    found = route(variant(SPEC, 1, kind), SPEC)
    assert found.target == "dlq" and found.reason == kind and found.detail


def test_good_records_and_tool_calls_go_to_s3() -> None:
    assert route(variant(SPEC, 1, "good"), SPEC) == Route("s3")
    assert route(variant(SPEC, 1, "tool_call"), SPEC) == Route("s3")


def test_a_reason_the_policy_does_not_list_goes_to_s3() -> None:
    lenient = make_spec("r", dlq_reasons=["failed"])
    assert route(variant(lenient, 1, "trivial"), lenient) == Route("s3")
    assert route(variant(lenient, 1, "failed"), lenient).reason == "failed"


def _keys(partition: int, *firsts: int, prefix: str = "out/") -> list[str]:
    return [object_key(prefix, "r", partition, f) for f in firsts]


def test_choose_key_takes_the_last_object_starting_at_or_before_the_offset() -> None:
    keys = _keys(0, 0, 500, 1000) + _keys(1, 0, 700)
    assert choose_key(keys, 0, 0) == keys[0]
    assert choose_key(keys, 0, 499) == keys[0]
    assert choose_key(keys, 0, 500) == keys[1]
    assert choose_key(keys, 0, 999) == keys[1]
    assert choose_key(keys, 0, 10**12) == keys[2]
    assert choose_key(keys, 1, 699) == keys[3]
    assert choose_key(keys, 2, 5) is None


def test_choose_key_ignores_order_foreign_keys_and_takes_one_of_two_compressions() -> None:
    keys = list(reversed(_keys(3, 10, 20))) + ["out/r/notes.txt", "elsewhere"]
    assert choose_key(keys, 3, 15) == _keys(3, 10)[0]
    assert choose_key(keys, 3, 5) is None
    both = [object_key("", "r", 0, 0, "zstd"), object_key("", "r", 0, 0, "none")]
    assert choose_key(both, 0, 3) == object_key("", "r", 0, 0, "zstd")
    assert choose_key([], 0, 3) is None


def test_holds_reads_the_sinks_record_range() -> None:
    meta = {"first-offset": "500", "last-offset": "730"}
    assert holds(meta, 500) and holds(meta, 730)
    assert holds(meta, 731) is False and holds(meta, 499) is False
    assert holds({}, 3) is None and holds({"first-offset": "x", "last-offset": "1"}, 0) is None


def test_labels() -> None:
    assert s3_label(None, None) == "S3 (not yet persisted)"
    assert s3_label("r/partition=0000/offset=1.jsonl", False) == "S3 (not yet persisted)"
    assert s3_label("k", True) == "S3: k"
    assert "no record range" in s3_label("k", None)


def test_describe_error_is_short() -> None:
    missing = ClientError({"Error": {"Code": "NoSuchBucket"}}, "ListObjectsV2")
    denied = ClientError({"Error": {"Code": "AccessDenied"}}, "ListObjectsV2")
    other = ClientError({"Error": {"Code": "SlowDown"}}, "ListObjectsV2")
    assert describe_error(missing, "b") == "no bucket b"
    assert describe_error(denied, "b") == "access to bucket b denied"
    assert describe_error(other, "b") == "S3 answered SlowDown"
    assert describe_error(EndpointConnectionError(endpoint_url="http://x"), "b") == "S3 unreachable"
    assert describe_error(NoCredentialsError(), "b") == "no S3 credentials"


def test_no_bucket_configured_is_said_not_raised() -> None:
    assert KeyFinder.for_run(Settings(), SPEC) == "no S3 bucket configured"


def test_an_unreachable_endpoint_costs_one_bounded_try(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    finder = KeyFinder.for_run(Settings(s3_endpoint_url=f"http://127.0.0.1:{port}",
                                        s3_bucket="b"), SPEC)
    assert isinstance(finder, KeyFinder)
    started = time.monotonic()
    labels = [finder.label(0, offset) for offset in range(5)]
    assert time.monotonic() - started < 20
    assert labels == ["S3 (key unknown: S3 unreachable)"] * 5
