"""The sink's start-up check of its S3 store: does it honour the conditional
writes that keep a sink which lost its partitions from overwriting a newer
object (sink/batcher.py)?

Before consuming, the sink writes a scratch key under the run's prefix
(`{prefix}{run}/_tokenmill-store-check/{instance}-{random}`) and asks:

1. PUT `If-None-Match: *` on the new key: must succeed;
2. the same again: must be refused (412): *conditional create*;
3. PUT `If-Match: <a wrong ETag>`: must be refused: *conditional replace*;
4. PUT `If-Match: <the ETag it returned>`: must succeed. Some stores (Ceph
   RGW 16) compare the header with the ETag unquoted: when the quoted form
   is refused, the unquoted one is tried, and the sink sends that form;
5. CompleteMultipartUpload with `If-None-Match: *` on the existing key, and
6. with `If-Match: <a wrong ETag>`: both must be refused, or the sink puts
   every object in one PUT (up to 5 GiB) instead of parts;

then deletes the scratch key (a check killed midway leaves it: the next
start of the same instance deletes it first). A store that fails 2, 3 or 4 is refused with
one line naming it and what it lacks, unless `--no-conditional-writes`
turns the protection (and this check) off. `decide` and `refusal` are pure;
`probe` does the requests.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sink.errors import S3Failed, SinkError
from tokenmill.log import get_logger

log = get_logger("tokenmill.sink.store")

SINGLE_PUT_MAX = 5 * 1024**3  # S3's largest single PUT
WRONG_ETAG = '"00000000000000000000000000000000"'
OK = "ok"
REFUSED = "412"  # a failed precondition (409 ConditionalRequestConflict counts too)


class StoreRefused(SinkError):
    """The S3 store does not honour a conditional write the sink relies on."""


@dataclass(frozen=True)
class Observed:
    """What the store answered to each probe: `OK`, `REFUSED`, or
    `"<status> <code>"` (e.g. `"501 NotImplemented"`); None: not asked."""

    store: str  # the endpoint, and the Server header when the store sends one
    create: str
    create_again: str | None = None
    replace_wrong: str | None = None
    replace_quoted: str | None = None
    replace_unquoted: str | None = None
    multipart_create_again: str | None = None
    multipart_replace_wrong: str | None = None


@dataclass(frozen=True)
class StoreProfile:
    """What the sink may rely on, and how to send it."""

    conditional_create: bool
    conditional_replace: bool
    etag_unquoted: bool
    multipart_conditions: bool
    missing: tuple[str, ...]  # what the store does not honour, as the refusal names it


def decide(seen: Observed) -> StoreProfile:
    """Pure: the store's profile from its answers."""
    create = seen.create == OK and seen.create_again == REFUSED
    wrong_refused = seen.replace_wrong == REFUSED
    unquoted = seen.replace_quoted != OK and seen.replace_unquoted == OK
    replace = wrong_refused and (seen.replace_quoted == OK or unquoted)
    multipart = (seen.multipart_create_again == REFUSED
                 and seen.multipart_replace_wrong == REFUSED)
    missing = []
    if seen.create != OK:
        missing.append(f"If-None-Match: * on PutObject (a create of a new key was answered "
                       f"{_said(seen.create)})")
        return StoreProfile(conditional_create=False, conditional_replace=False,
                            etag_unquoted=False, multipart_conditions=False,
                            missing=tuple(missing))  # nothing more was asked
    if not create:
        missing.append(f"If-None-Match: * on PutObject (a create of an existing key was "
                       f"answered {_said(seen.create_again)})")
    if not wrong_refused:
        missing.append(f"If-Match on PutObject (a replace naming a wrong ETag was answered "
                       f"{_said(seen.replace_wrong)})")
    elif not replace:
        missing.append(f"If-Match on PutObject (a replace naming the object's own ETag was "
                       f"answered {_said(seen.replace_quoted)}, unquoted "
                       f"{_said(seen.replace_unquoted)})")
    return StoreProfile(conditional_create=create, conditional_replace=replace,
                        etag_unquoted=unquoted, multipart_conditions=multipart,
                        missing=tuple(missing))


def _said(answer: str | None) -> str:
    if answer == OK:
        return "200 (it overwrote the object)"
    return answer or "nothing"


def refusal(seen: Observed, profile: StoreProfile, max_batch_bytes: int) -> str | None:
    """Pure: the one line that refuses this store, or None."""
    missing = list(profile.missing)
    if not profile.multipart_conditions and max_batch_bytes > SINGLE_PUT_MAX - 64 * 1024**2:
        missing.append("conditions on CompleteMultipartUpload, which objects over 5 GiB "
                       "need (lower --max-batch-bytes)")
    if not missing:
        return None
    return (f"the S3 store {seen.store} does not honour {'; nor '.join(missing)}: a sink that "
            "lost its partitions could overwrite a newer object. Use a store that does, or "
            "pass --no-conditional-writes to run without that protection "
            "(docs/commands/sink.md)")


def scratch_prefix(prefix: str, run: str, instance: str) -> str:
    return f"{prefix}{run}/_tokenmill-store-check/{instance}-"


def scratch_key(prefix: str, run: str, instance: str) -> str:
    return f"{scratch_prefix(prefix, run, instance)}{secrets.token_hex(6)}"


def remove_leftovers(client: Any, bucket: str, prefix: str) -> list[str]:
    """Delete the scratch keys an earlier check of this instance left behind
    (it was killed mid-check). Only this instance's: another instance may be
    checking right now. Returns the keys deleted."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    keys = [str(item["Key"]) for item in listed.get("Contents", [])]
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    return keys


def _answer(call: Any) -> tuple[str, dict[str, Any]]:
    try:
        response = call()
        return OK, response
    except ClientError as exc:
        meta = exc.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode", 0) or 0)
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return REFUSED, exc.response
        return f"{status} {code}".strip(), exc.response


def _server(response: dict[str, Any]) -> str:
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return str(headers.get("server", ""))


def probe(client: Any, bucket: str, key: str, endpoint: str | None) -> Observed:
    """Ask the store (see the module's docstring); the scratch key is deleted."""
    body = b"tokenmill store check\n"

    def put(**conditions: str) -> tuple[str, dict[str, Any]]:
        return _answer(lambda: client.put_object(Bucket=bucket, Key=key, Body=body,
                                                 **conditions))

    try:
        create, first = put(IfNoneMatch="*")
        if create == REFUSED:
            # The key is random: only this create's own first attempt, whose
            # answer was lost and which botocore retried, can have made it.
            create = OK
        server = _server(first)
        store = endpoint or "AWS S3"
        store = f"{store} ({server})" if server else store
        if create != OK:  # the store rejects the header: nothing was written
            return Observed(store=store, create=create)
        etag = str(first.get("ETag", ""))
        try:
            create_again, _ = put(IfNoneMatch="*")
            replace_wrong, _ = put(IfMatch=WRONG_ETAG)
            if not etag:
                etag = str(client.head_object(Bucket=bucket, Key=key)["ETag"])
            replace_quoted, _ = put(IfMatch=etag)
            unquoted = None
            if replace_quoted != OK:
                unquoted, _ = put(IfMatch=etag.strip('"'))
            multipart_create = _multipart(client, bucket, key, IfNoneMatch="*")
            multipart_replace = _multipart(client, bucket, key, IfMatch=WRONG_ETAG)
        finally:
            client.delete_object(Bucket=bucket, Key=key)
    except (BotoCoreError, ClientError) as exc:
        raise S3Failed(f"the S3 store check at {endpoint or 'AWS S3'} (bucket {bucket}) "
                       f"failed: {exc}") from None
    return Observed(store=store, create=create,
                    create_again=create_again, replace_wrong=replace_wrong,
                    replace_quoted=replace_quoted, replace_unquoted=unquoted,
                    multipart_create_again=multipart_create,
                    multipart_replace_wrong=multipart_replace)


def _multipart(client: Any, bucket: str, key: str, **conditions: str) -> str:
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    try:
        part = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1,
                                  Body=b"tokenmill store check, multipart\n")
        answer, _ = _answer(lambda: client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
            **conditions))
        return answer
    finally:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except ClientError:
            pass  # completed (the store ignored the condition), or already gone


def check(writer: Any, *, endpoint: str | None, region: str, prefix: str, run: str,
          instance: str, max_batch_bytes: int) -> StoreProfile | None:
    """The sink's start-up check: probe (with a client of its own, so the
    upload client's hooks and error counters see uploads only), then adapt
    `writer` (an S3Writer) to what the store honours, or raise StoreRefused.
    Skipped (None) when the writer sends no conditions
    (`--no-conditional-writes`)."""
    from sink.s3_writer import make_client

    if not writer.conditional_writes:
        log.warning("conditional writes are off (--no-conditional-writes): a sink that lost "
                    "its partitions can overwrite a newer object", endpoint=endpoint)
        return None
    client = make_client(endpoint_url=endpoint, region=region, max_pool=1)
    try:
        left = remove_leftovers(client, writer.bucket, scratch_prefix(prefix, run, instance))
    except (BotoCoreError, ClientError) as exc:
        raise S3Failed(f"the S3 store check at {endpoint or 'AWS S3'} (bucket {writer.bucket}) "
                       f"failed: {exc}") from None
    if left:
        log.info("deleted what an interrupted store check left", keys=left)
    seen = probe(client, writer.bucket, scratch_key(prefix, run, instance), endpoint)
    profile = decide(seen)
    refused = refusal(seen, profile, max_batch_bytes)
    if refused is not None:
        raise StoreRefused(refused)
    writer.adapt(profile)
    log.info("S3 store checked", store=seen.store, etag_unquoted=profile.etag_unquoted,
             multipart_conditions=profile.multipart_conditions)
    if not profile.multipart_conditions:
        log.info("the store ignores conditions on CompleteMultipartUpload: objects go up in "
                 "one PUT", store=seen.store)
    return profile
