"""The batches' objects in S3: a batch's object written, and the objects at
the key of the batch a partition starts next looked up. Both run in the
upload pool, so the loop never waits on S3 (uploads are parallel across
partitions; sink/round.py decides which)."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

from botocore.exceptions import BotoCoreError, ClientError

from sink import object_keys, objects
from sink.batcher import Batch, ExistingObject
from sink.config import SinkConfig
from sink.errors import S3Failed
from sink.metrics import SinkMetrics
from sink.s3_writer import S3Writer, Uploaded


class ObjectStore:
    """Parameters: `writer` (the bucket's `S3Writer`), `config`, `topic`
    (the completions topic, for the objects' metadata), `settings_hash`
    (the run's), `metrics`."""

    def __init__(self, *, writer: S3Writer, config: SinkConfig, topic: str, settings_hash: str,
                 metrics: SinkMetrics) -> None:
        self._s3 = writer
        self._config = config
        self._topic = topic
        self._settings_hash = settings_hash
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(max_workers=config.upload_concurrency,
                                        thread_name_prefix="sink-upload")

    def upload(self, batch: Batch) -> Future[Uploaded | None]:
        """Start writing the batch's object (None: a batch of DLQ records only)."""
        return self._pool.submit(self._upload, batch)

    def lookup(self, partition: int, first_offset: int) -> Future[tuple[ExistingObject, ...]]:
        """Start looking up the objects an earlier owner wrote for the batch
        of `partition` starting at `first_offset`."""
        config = self._config
        keys = object_keys.candidate_keys(config.prefix, config.run, partition, first_offset)
        return self._pool.submit(self._lookup, partition, keys)

    def shutdown(self) -> None:
        """Wait for the calls in flight; no new ones."""
        self._pool.shutdown(wait=True)

    def _lookup(self, partition: int, keys: list[str]) -> tuple[ExistingObject, ...]:
        try:
            return self._s3.probe(keys)
        except (BotoCoreError, ClientError) as exc:
            raise S3Failed(f"s3 lookup of {keys[0]} for partition {partition} failed after "
                           f"retries: {exc}") from exc

    def _upload(self, batch: Batch) -> Uploaded | None:
        try:
            return self._write_object(batch)
        except (BotoCoreError, ClientError) as exc:
            raise S3Failed(f"s3 write for partition {batch.partition} at offset "
                           f"{batch.first_offset} failed after retries: {exc}") from exc

    def _write_object(self, batch: Batch) -> Uploaded | None:
        config = self._config
        key = object_keys.object_key(config.prefix, config.run, batch.partition,
                                     batch.first_offset, config.compression)
        same = next((o for o in batch.existing if o.key == key), None)
        if batch.line_count:
            data = objects.body(batch.lines, config.compression)
            started = time.perf_counter()
            uploaded = self._s3.upload(
                key, data, objects.metadata(batch, run=config.run, topic=self._topic,
                                            settings_hash=self._settings_hash),
                content_type="application/zstd" if config.compression == "zstd"
                else "application/x-ndjson",
                if_match=same.etag if same else None)
            self._metrics.upload_seconds.observe(time.perf_counter() - started)
        else:
            uploaded = None
        # Objects an earlier owner wrote for this range under another name
        # (other compression), or that now has no lines: they must go.
        for obj in batch.existing:
            if uploaded is None or obj.key != key:
                self._s3.delete(obj.key)
        return uploaded
