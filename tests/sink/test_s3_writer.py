"""S3Writer against the real S3 server (tests/conftest.py REAL_S3_TESTS):
conditional writes, multipart, probes, bucket creation. The writer is
adapted by the sink's start-up check, as the sink's is."""

from __future__ import annotations

import os

import pytest

from sink import store_check
from sink.errors import BucketMissing, ObjectConflict
from sink.objects import ForeignObject
from sink.s3_writer import MiB, S3Writer, is_local_endpoint, make_client
from tests.sink.sink_helpers import s3_client

pytestmark = pytest.mark.s3

META = {"first-offset": "4", "last-offset": "9", "records": "3"}


@pytest.fixture
def writer(settings, services) -> S3Writer:
    client = make_client(endpoint_url=settings.s3_endpoint_url, region="us-east-1")
    w = S3Writer(client=client, bucket=settings.s3_bucket, multipart_threshold=6 * MiB,
                 part_size=5 * MiB)
    w.ensure_bucket(create=True, region="us-east-1")
    store_check.check(w, endpoint=settings.s3_endpoint_url, region="us-east-1", prefix="",
                      run="t", instance="test", max_batch_bytes=64 * MiB)
    return w


def test_missing_bucket_is_created_only_when_allowed(settings) -> None:
    client = make_client(endpoint_url=settings.s3_endpoint_url, region="us-east-1")
    writer = S3Writer(client=client, bucket=settings.s3_bucket)
    with pytest.raises(BucketMissing, match="--create-bucket"):
        writer.ensure_bucket(create=False, region="us-east-1")
    assert writer.ensure_bucket(create=True, region="us-east-1") is True
    assert writer.ensure_bucket(create=False, region="us-east-1") is False


def test_writes_are_conditional(writer, settings) -> None:
    first = writer.upload("k/a.jsonl", b"one\n", META, content_type="application/x-ndjson")
    with pytest.raises(ObjectConflict):  # the key exists: a create must not overwrite
        writer.upload("k/a.jsonl", b"two\n", META, content_type="application/x-ndjson")
    replaced = writer.upload("k/a.jsonl", b"three\n", META, content_type="application/x-ndjson",
                             if_match=first.etag)
    with pytest.raises(ObjectConflict):  # a stale etag: someone else wrote since the probe
        writer.upload("k/a.jsonl", b"four\n", META, content_type="application/x-ndjson",
                      if_match=first.etag)
    with pytest.raises(ObjectConflict):  # a replace of an object that vanished
        writer.upload("k/gone.jsonl", b"x\n", META, content_type="application/x-ndjson",
                      if_match=first.etag)
    body = s3_client(settings).get_object(Bucket=settings.s3_bucket, Key="k/a.jsonl")
    assert body["Body"].read() == b"three\n" and replaced.parts == 1


def test_large_objects_go_up_in_parts_with_metadata_and_conditions(writer, settings) -> None:
    """Above the threshold: parts, where the store honours conditions on
    CompleteMultipartUpload; one conditional PUT where it does not (Ceph 16)."""
    data = os.urandom(12 * MiB + 123)
    uploaded = writer.upload("k/big.jsonl", data, META, content_type="application/x-ndjson")
    assert uploaded.parts == (3 if writer.multipart_conditions else 1)
    assert uploaded.size == len(data)
    got = s3_client(settings).get_object(Bucket=settings.s3_bucket, Key="k/big.jsonl")
    assert got["Body"].read() == data
    assert got["Metadata"] == META
    with pytest.raises(ObjectConflict):
        writer.upload("k/big.jsonl", data, META, content_type="application/x-ndjson")
    # A failed multipart upload is aborted, not left behind.
    uploads = s3_client(settings).list_multipart_uploads(Bucket=settings.s3_bucket)
    assert not uploads.get("Uploads")


def test_probe_reads_the_record_range_and_refuses_foreign_objects(writer, settings) -> None:
    assert writer.probe(["k/none.jsonl"]) == ()
    up = writer.upload("k/p.jsonl", b"l\n", META, content_type="application/x-ndjson")
    (found,) = writer.probe(["k/none.jsonl", "k/p.jsonl"])
    assert (found.key, found.etag, found.first_offset, found.last_offset, found.records) == (
        "k/p.jsonl", up.etag, 4, 9, 3)
    s3_client(settings).put_object(Bucket=settings.s3_bucket, Key="k/foreign.jsonl", Body=b"?")
    with pytest.raises(ForeignObject, match="k/foreign.jsonl"):
        writer.probe(["k/foreign.jsonl"])


def test_client_retries_and_local_endpoint_detection() -> None:
    client = make_client(endpoint_url="http://127.0.0.1:9", region="us-east-1", max_attempts=7)
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 7}
    assert is_local_endpoint("http://127.0.0.1:9000") and is_local_endpoint("http://localhost:1")
    assert not is_local_endpoint(None) and not is_local_endpoint("https://s3.amazonaws.com")
    assert not is_local_endpoint("http://10.0.0.5:9000")


def test_unconditional_large_objects_go_up_in_parts(settings) -> None:
    """The store takes multipart uploads (with --no-conditional-writes the
    sink uses them whatever the store honours)."""
    client = make_client(endpoint_url=settings.s3_endpoint_url, region="us-east-1")
    writer = S3Writer(client=client, bucket=settings.s3_bucket, multipart_threshold=6 * MiB,
                      part_size=5 * MiB, conditional_writes=False)
    writer.ensure_bucket(create=True, region="us-east-1")
    data = os.urandom(11 * MiB)
    assert writer.upload("k/parts.jsonl", data, META,
                         content_type="application/x-ndjson").parts == 3
    got = s3_client(settings).get_object(Bucket=settings.s3_bucket, Key="k/parts.jsonl")
    assert got["Body"].read() == data and got["Metadata"] == META
