"""`tokenmill report` on the real broker and S3 server: a run's results
written where the sink leaves them (S3 objects under the sink's keys, dead
letters with their headers, progress records), then the command as a user
runs it. The figures are checked against the records as written, counted
here with json and without tokenmill's aggregator; a lineage counts each
prompt of its root once; an unfinished lineage is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import msgspec
import pytest
from confluent_kafka import Producer

from bench import report_records
from schemas import Completion, DeadLetter, GenerationSettings, RunSpec, Usage
from schemas.dlq import HEADER_REASON
from schemas.progress import SinkProgress, producer_key, sink_key
from schemas.run import Estimate, Origin
from sink.object_keys import object_key
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.s3]

REPO = Path(__file__).resolve().parents[2]
PER_OBJECT = 100


def write_run(settings: Settings, spec: RunSpec, results: list[tuple[bool, bytes]],
              done: bool = True, gpus: int = 2) -> None:
    """What a finished run leaves: S3 objects, dead letters, progress records."""
    RunRegistry(settings).create_run(spec)
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1")
    try:
        s3.create_bucket(Bucket=settings.s3_bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    lines = [data for accepted, data in results if accepted]
    for n in range(0, len(lines), PER_OBJECT):
        s3.put_object(Bucket=settings.s3_bucket, Key=object_key("", spec.run_id, 0, n),
                      Body=b"\n".join(lines[n:n + PER_OBJECT]) + b"\n")
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    letters = [data for accepted, data in results if not accepted]
    for data in letters:
        letter = json.loads(data)
        producer.produce(topics.dlq_topic(spec.run_id), key=letter["id"].encode(), value=data,
                         headers=[(HEADER_REASON, letter["reason"].encode())])
    progress = topics.progress_topic(spec.run_id)
    for record in report_records.progress(run=spec.run_id, gpus=gpus, seconds=120, every=2.0,
                                          total=len(results)):
        key = (producer_key(spec.run_id) if record.__struct_config__.tag == "producer"
               else f"{spec.run_id}/consumer/{record.instance}")  # type: ignore[union-attr]
        producer.produce(progress, key=key.encode(), value=msgspec.json.encode(record))
    if done:
        producer.produce(progress, key=sink_key(spec.run_id, "s").encode(),
                         value=msgspec.json.encode(SinkProgress(
                             run=spec.run_id, instance="s", s3_records=len(lines),
                             dlq_records=len(letters), dlq_by_reason=dict(Counter(
                                 json.loads(d)["reason"] for d in letters)))))
    assert producer.flush(30) == 0


def report(settings: Settings, run_id: str, out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENMILL_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
           "TOKENMILL_S3_ENDPOINT_URL": settings.s3_endpoint_url or "",
           "TOKENMILL_S3_BUCKET": settings.s3_bucket or "", "PYTHONPATH": str(REPO),
           "TOKENMILL_STATE_DIR": str(settings.state_dir)}
    return subprocess.run([sys.executable, "-m", "tokenmill.cli", "report", run_id, "--out",
                           str(out)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO, check=False)


def finish_counts(results: list[tuple[bool, bytes]]) -> Counter[str]:
    """Results by category, read with json: what the finish-reason chart must sum to."""
    counts: Counter[str] = Counter()
    for accepted, data in results:
        record: dict[str, Any] = json.loads(data)
        counts[record["category"] if accepted else record["record"]["prompt"]["category"]] += 1
    return counts


def test_a_run_reported_from_what_its_services_left(settings: Settings, run_id: str,
                                                    tmp_path: Path) -> None:
    spec = RunSpec(run_id=run_id, partitions=1,
                   generation=GenerationSettings(model="sim", max_tokens=4096),
                   estimate=Estimate(requests_per_s=5.0, source="flags"))
    results = list(report_records.results(700, run=run_id, conversations=0.1))
    write_run(settings, spec, results)
    done = report(settings, run_id, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    figures = json.loads((tmp_path / "out" / "report.json").read_text())
    accepted = sum(1 for ok, _ in results if ok)
    assert (figures["records"], figures["accepted"], figures["dead_letters"]) == (
        700, accepted, 700 - accepted)
    assert f"report of 700 results ({accepted:,} accepted" in done.stdout
    by_category = {name: sum(row.values()) for name, row in figures["finish_by_category"]["rows"]}
    assert by_category == dict(finish_counts(results))
    assert figures["max_tokens"] == [4096] and figures["conversations"] > 0
    timeline = figures["timeline"]
    assert [s["name"] for s in timeline["throughput"]] == ["gpu0", "gpu1"]
    assert timeline["planned"] and [s["name"] for s in timeline["progress"]] == [
        f"{run_id} generated", f"{run_id} plan"]
    page = (tmp_path / "out" / "report.html").read_text()
    assert f"tokenmill report: {run_id}" in page and page.count('<svg class="plot"') >= 12


def test_a_lineage_counts_each_prompt_once(settings: Settings, run_id: str,
                                           tmp_path: Path) -> None:
    root = RunSpec(run_id=run_id, partitions=1,
                   generation=GenerationSettings(model="sim", max_tokens=4096))
    results = list(report_records.results(500, run=run_id))
    write_run(settings, root, results)
    redriven = [msgspec.json.decode(data, type=DeadLetter).record for ok, data in results
                if not ok and json.loads(data)["reason"] == "length"]
    child = RunSpec(run_id=f"{run_id}-8k", partitions=1, parent_run=run_id,
                    origin=Origin(kind="redrive", reasons=("length",)),
                    generation=GenerationSettings(model="sim", max_tokens=8192))
    answers = [(True, report_records.s3_line(msgspec.structs.replace(
        r, run=child.run_id, finish_reason="stop", usage=Usage(completion_tokens=5000))))
        for r in redriven if isinstance(r, Completion)]
    write_run(settings, child, answers, done=False)
    refused = report(settings, child.run_id, tmp_path / "refused")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "still in progress" in refused.stderr and not (tmp_path / "refused").exists()
    done_progress = Producer({"bootstrap.servers": settings.bootstrap_servers})
    done_progress.produce(topics.progress_topic(child.run_id),
                          key=sink_key(child.run_id, "s").encode(),
                          value=msgspec.json.encode(SinkProgress(
                              run=child.run_id, instance="s", s3_records=len(answers))))
    assert done_progress.flush(30) == 0
    done = report(settings, child.run_id, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    figures = json.loads((tmp_path / "out" / "report.json").read_text())
    failed = sum(1 for ok, data in results if not ok and json.loads(data)["reason"] == "failed")
    assert figures["records"] == 500  # the root's prompts, each once
    assert figures["dead_letters"] == failed  # the length ones were redriven and accepted
    assert figures["runs"] == [run_id, child.run_id] and figures["max_tokens"] == [4096, 8192]
    truncated = sum(row["truncated"] for row in figures["lengths"])
    assert truncated == 0  # every truncated answer was replaced by the redrive's
    gpus = [s["name"] for s in figures["timeline"]["throughput"]]
    assert gpus == [f"{r}/gpu{g}" for r in (run_id, child.run_id) for g in (0, 1)]


def test_a_run_with_nothing_yet_gives_a_page_that_says_so(settings: Settings, run_id: str,
                                                          tmp_path: Path) -> None:
    """Registered, nothing published: no bucket, empty topics, no counters."""
    RunRegistry(settings).create_run(RunSpec(run_id=run_id, partitions=2))
    done = report(settings, run_id, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    figures = json.loads((tmp_path / "out" / "report.json").read_text())
    assert figures["records"] == 0 and figures["timeline"]["snapshots"] == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "This run has no results yet" in page and "does not exist" in page
    assert f"run {run_id} has published no prompt yet" in page
    assert '<svg class="plot"' not in page  # every chart says why it is empty instead
