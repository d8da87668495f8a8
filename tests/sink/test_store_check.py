"""The sink's start-up check of its S3 store (sink/store_check.py): the pure
decision, then against moto, the real store, and a store that ignores (or
rejects) conditional headers, which the sink refuses in one line unless
`--no-conditional-writes` is given."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest
from aiohttp import web

from devstack.processes import free_port
from sink import store_check
from sink.s3_writer import S3Writer, make_client
from sink.store_check import OK, REFUSED, Observed, decide, refusal
from tests.sink.sink_helpers import (
    REPO,
    create_run,
    feed,
    good,
    make_spec,
    publish_done,
    sink_env,
)

GOOD = Observed(store="http://s3", create=OK, create_again=REFUSED, replace_wrong=REFUSED,
                replace_quoted=OK, multipart_create_again=REFUSED,
                multipart_replace_wrong=REFUSED)
MiB = 1024 * 1024


# -- the decision (pure) ---------------------------------------------------------


def test_a_store_that_honours_everything_is_taken_as_it_is() -> None:
    profile = decide(GOOD)
    assert (profile.conditional_create, profile.conditional_replace, profile.etag_unquoted,
            profile.multipart_conditions, profile.missing) == (True, True, False, True, ())
    assert refusal(GOOD, profile, 64 * MiB) is None


def test_ceph_16_wants_the_etag_unquoted_and_ignores_multipart_conditions() -> None:
    seen = dataclasses.replace(GOOD, replace_quoted=REFUSED, replace_unquoted=OK,
                                   multipart_create_again=OK, multipart_replace_wrong=OK)
    profile = decide(seen)
    assert profile.conditional_replace and profile.etag_unquoted
    assert not profile.multipart_conditions and not profile.missing
    assert refusal(seen, profile, 64 * MiB) is None
    # ... unless batches may outgrow one PUT
    line = refusal(seen, profile, 6 * 1024 * MiB)
    assert line is not None and "CompleteMultipartUpload" in line and "--max-batch-bytes" in line


@pytest.mark.parametrize("field,answer,named", [
    ("create_again", OK, "If-None-Match: * on PutObject"),
    ("create_again", "501 NotImplemented", "If-None-Match: * on PutObject"),
    ("create", "501 NotImplemented", "If-None-Match: * on PutObject (a create of a new key"),
    ("replace_wrong", OK, "If-Match on PutObject"),
    ("replace_wrong", "400 InvalidArgument", "If-Match on PutObject"),
    ("replace_quoted", REFUSED, "If-Match on PutObject"),
])
def test_a_missing_feature_is_refused_in_one_line_naming_store_and_feature(
        field: str, answer: str, named: str) -> None:
    seen = dataclasses.replace(GOOD, **{field: answer})
    if field == "replace_quoted":
        seen = dataclasses.replace(seen, replace_unquoted=REFUSED)
    line = refusal(seen, decide(seen), 64 * MiB)
    assert line is not None and "\n" not in line
    assert line.startswith("the S3 store http://s3 does not honour ")
    assert named in line and "--no-conditional-writes" in line
    if answer == OK:
        assert "it overwrote the object" in line


def test_two_missing_features_are_both_named() -> None:
    seen = dataclasses.replace(GOOD, create_again=OK, replace_wrong=OK)
    line = refusal(seen, decide(seen), 64 * MiB)
    assert line is not None
    assert "If-None-Match: *" in line and "; nor If-Match" in line


# -- against stores ------------------------------------------------------------------


def _check(endpoint: str, bucket: str) -> store_check.StoreProfile | None:
    writer = S3Writer(client=make_client(endpoint_url=endpoint, region="us-east-1"),
                      bucket=bucket)
    writer.ensure_bucket(create=True, region="us-east-1")
    profile = store_check.check(writer, endpoint=endpoint, region="us-east-1", prefix="p/",
                                run="r", instance="i", max_batch_bytes=64 * MiB)
    listed = writer.client.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert not [item for item in listed if item["Key"].startswith("p/r/_tokenmill-store-check/i-")]
    return profile


@pytest.mark.s3
def test_moto_honours_put_conditions_but_not_if_match_on_multipart(services, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", services.s3_access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", services.s3_secret_key)
    profile = _check(services.s3_endpoint_url, f"tm-{uuid.uuid4().hex[:12]}")
    assert profile is not None and not profile.missing
    assert not profile.etag_unquoted
    if services.origin != "environment":  # moto, as found here
        assert not profile.multipart_conditions


@pytest.mark.s3
def test_the_real_store_passes_the_check(settings) -> None:
    profile = _check(settings.s3_endpoint_url, settings.s3_bucket)
    assert profile is not None and profile.conditional_create and profile.conditional_replace


# -- a store that ignores the headers: refused at start-up -------------------------------


class StubS3:
    """A tiny S3 store that ignores conditional headers (`mode` "ignore") or
    rejects them (`mode` "reject": 501, as S3Proxy does on some backends).
    Enough of the API for the sink: buckets, objects with metadata, multipart."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.parts: dict[str, dict[int, bytes]] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        bucket, _, key = request.path.lstrip("/").partition("/")
        query = request.query
        if not key:
            return web.Response(status=200)  # HEAD/PUT bucket
        conditional = "If-None-Match" in request.headers or "If-Match" in request.headers
        if self.mode == "reject" and conditional and request.method in ("PUT", "POST"):
            return _error(501, "NotImplemented")
        if request.method == "POST" and "uploads" in query:
            upload = uuid.uuid4().hex
            self.parts[upload] = {}
            return _xml(f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{key}"
                        f"</Key><UploadId>{upload}</UploadId></InitiateMultipartUploadResult>")
        if request.method == "PUT" and "uploadId" in query:
            body = await request.read()
            self.parts[query["uploadId"]][int(query["partNumber"])] = body
            return web.Response(headers={"ETag": _etag(body)})
        if request.method == "POST" and "uploadId" in query:
            parts = self.parts.pop(query["uploadId"])
            body = b"".join(parts[n] for n in sorted(parts))
            self.objects[key] = (body, {})
            return _xml(f"<CompleteMultipartUploadResult><Key>{key}</Key><ETag>{_etag(body)}"
                        "</ETag></CompleteMultipartUploadResult>")
        if request.method == "DELETE":
            if "uploadId" in query:
                self.parts.pop(query["uploadId"], None)
            else:
                self.objects.pop(key, None)
            return web.Response(status=204)
        if request.method == "PUT":
            body = await request.read()
            meta = {k: v for k, v in request.headers.items() if k.lower().startswith("x-amz-meta-")}
            self.objects[key] = (body, meta)
            return web.Response(headers={"ETag": _etag(body)})
        if key not in self.objects:
            return _error(404, "NoSuchKey")
        body, meta = self.objects[key]
        response = web.StreamResponse(headers={"ETag": _etag(body), **meta})
        response.content_length = len(body)
        await response.prepare(request)
        if request.method == "GET":
            await response.write(body)
        await response.write_eof()
        return response


def _etag(body: bytes) -> str:
    return f'"{hashlib.md5(body).hexdigest()}"'  # noqa: S324 - S3's ETag


def _xml(text: str) -> web.Response:
    return web.Response(body=f'<?xml version="1.0" encoding="UTF-8"?>{text}'.encode(),
                        content_type="application/xml")


def _error(status: int, code: str) -> web.Response:
    return web.Response(status=status, content_type="application/xml",
                        body=f"<Error><Code>{code}</Code><Message>{code}</Message></Error>"
                        .encode())


@contextmanager
def stub_s3(mode: str) -> Iterator[tuple[str, StubS3]]:
    stub = StubS3(mode)
    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application(client_max_size=1024**3)
    app.router.add_route("*", "/{tail:.*}", stub.handle)
    runner = web.AppRunner(app, access_log=None)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port}", stub
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _sink(settings, run_id: str, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = sink_env(settings, TOKENMILL_S3_ENDPOINT_URL=endpoint, TOKENMILL_LOG_FORMAT="console")
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "sink", "--run", run_id,
                           "--batch-size", "10", "--max-batch-age", "1", "--until-done",
                           "--session-timeout", "6", *args],
                          env=env, capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.parametrize("mode,named", [
    ("ignore", "If-None-Match: * on PutObject (a create of an existing key was answered 200 "
               "(it overwrote the object))"),
    ("reject", "If-None-Match: * on PutObject (a create of a new key was answered "
               "501 NotImplemented)"),
])
def test_the_sink_refuses_a_store_without_conditional_writes_in_one_line(
        settings, run_id, mode: str, named: str) -> None:
    spec = make_spec(run_id, partitions=1)
    create_run(settings, spec)
    with stub_s3(mode) as (endpoint, stub):
        result = _sink(settings, run_id, endpoint)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    (line,) = errors
    assert line.startswith(f"Error: the S3 store {endpoint} ")
    assert named in line and "--no-conditional-writes" in line
    assert "Traceback" not in result.stderr
    assert not [k for k in stub.objects if "/partition=" in k]  # nothing was written
    assert not stub.objects  # the scratch key was deleted


@pytest.mark.broker
@pytest.mark.slow
def test_no_conditional_writes_skips_the_check_and_runs(settings, run_id) -> None:
    spec = make_spec(run_id, partitions=1)
    create_run(settings, spec)
    records = [good(spec, i) for i in range(40)]
    feed(settings, spec, records)
    publish_done(settings, run_id, len(records))
    with stub_s3("ignore") as (endpoint, stub):
        result = _sink(settings, run_id, endpoint, "--no-conditional-writes")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "conditional writes are off" in result.stderr
    ids = [msgspec.json.decode(line)["id"] for body, _ in stub.objects.values()
           for line in body.splitlines() if line]
    assert sorted(ids) == sorted(r.id for r in records)


@pytest.mark.s3
def test_a_check_killed_midway_leaves_a_scratch_key_the_next_start_deletes(settings) -> None:
    writer = S3Writer(client=make_client(endpoint_url=settings.s3_endpoint_url,
                                         region="us-east-1"), bucket=settings.s3_bucket)
    writer.ensure_bucket(create=True, region="us-east-1")
    mine = store_check.scratch_key("p/", "r", "i")
    other = store_check.scratch_key("p/", "r", "other")  # another instance's, checking now
    for key in (mine, other):
        writer.client.put_object(Bucket=settings.s3_bucket, Key=key, Body=b"left")
    assert _check(settings.s3_endpoint_url, settings.s3_bucket) is not None  # instance "i"
    listed = writer.client.list_objects_v2(Bucket=settings.s3_bucket).get("Contents", [])
    assert [item["Key"] for item in listed] == [other]
