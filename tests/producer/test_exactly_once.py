"""Exactly-once publishing across crashes, checked with kafka-python reading
`read_committed`: kill the producer mid-transaction (injected, and a real
kill -9 of `tokenmill produce`), run the same command again, and every
accepted prompt is in the topic exactly once."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from producer.synthetic import records, write_jsonl
from tests.producer.helpers import (
    REPO,
    assert_exactly_once,
    checkpoint,
    cli_args,
    cli_env,
    prompts,
    run_cli,
)
from tokenmill.kafka import topics

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def _dataset(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "mixed.jsonl"
    write_jsonl(path, records(n, seed=7, words=20))
    return path


def test_injected_crash_mid_transaction_then_rerun(settings, run_id, tmp_path: Path) -> None:
    path = _dataset(tmp_path, 3000)
    # Dies as its third transaction commits, after its records reached the broker.
    crashed = run_cli(settings, run_id, [path], "--transaction-records", "500",
                      kill_at="transaction.committing:3")
    assert crashed.returncode == 137, crashed.stderr
    assert "fault injection: killed" in crashed.stderr
    # Two transactions committed; the third reached the broker but never committed.
    assert len(prompts(settings, run_id)) == 1000
    assert len(prompts(settings, run_id, committed_only=False)) == 1500
    cp = checkpoint(settings, run_id)
    assert cp is not None and cp["next_seq"] == 1000 and cp["done"] is False

    resumed = run_cli(settings, run_id, [path], "--transaction-records", "500")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stdout and "1,000 of 3,000" in resumed.stdout
    assert "published 2,000 prompts" in resumed.stdout
    assert_exactly_once(settings, run_id, 3000)

    again = run_cli(settings, run_id, [path], "--transaction-records", "500")
    assert again.returncode == 0
    assert "nothing to publish (0 published)" in again.stdout
    assert len(prompts(settings, run_id)) == 3000


def _published_so_far(bootstrap: str, topic: str) -> int:
    """Records on the broker (committed or not): the high watermarks."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        found = consumer.partitions_for_topic(topic)
        if not found:
            return 0
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in found])
        return sum(ends.values())
    finally:
        consumer.close()


def test_kill_9_while_publishing_then_rerun(settings, run_id, tmp_path: Path) -> None:
    total = 12_000
    path = _dataset(tmp_path, total)
    proc = subprocess.Popen(cli_args(run_id, [path], "--transaction-records", "200"),
                            env=cli_env(settings), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    topic = topics.prompts_topic(run_id)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if _published_so_far(settings.bootstrap_servers, topic) >= 1000:
                break
            time.sleep(0.05)  # poll of a wait loop
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    committed = len(prompts(settings, run_id))
    assert 0 < committed < total, "the kill must land mid-publish"

    resumed = run_cli(settings, run_id, [path], "--transaction-records", "200")
    assert resumed.returncode == 0, resumed.stderr
    assert f"{committed:,} of {total:,} prompts already committed" in resumed.stdout
    assert_exactly_once(settings, run_id, total)


def test_a_second_producer_fences_the_first(settings, run_id, tmp_path: Path) -> None:
    """Two producers of one run (say, a hung one and its replacement): the
    newer one fences the older, whose transaction never becomes visible."""
    from producer.errors import ProducerError
    from producer.ingest import IngestOptions, ingest
    from producer.inputs import resolve
    from producer.publisher import Publisher, PublishPlan
    from producer.rejects import RejectsFile
    from producer.spool import SpoolWriter
    from tests.producer.helpers import spec_for
    from tokenmill.registry import RunRegistry

    path = _dataset(tmp_path, 500)
    spool = SpoolWriter(tmp_path / "spool")
    result = ingest(resolve([path]), IngestOptions(run_id, "last-user", "structured"), spool,
                    RejectsFile(tmp_path / "rejects.jsonl"))
    spool.close()
    RunRegistry(settings).create_run(spec_for(settings, run_id))
    plan = PublishPlan(run=run_id, topic=topics.prompts_topic(run_id), partitions=4,
                       bucket_counts=result.bucket_counts, spool_dir=tmp_path / "spool",
                       max_records=100)
    old, new = Publisher(settings, run_id), Publisher(settings, run_id)
    old.fence()
    new.fence()
    with pytest.raises(ProducerError, match="took over"):
        old.publish(plan, old.resume_point(plan))
    assert new.publish(plan, new.resume_point(plan)) == 500
    new.close()
    assert_exactly_once(settings, run_id, 500)


def test_resume_trusts_the_topic_over_a_lagging_checkpoint_view(
        settings, run_id, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read_committed view of the shared progress topic can lag; the run's
    own prompts topic cannot. Behind: resume from the topic. Ahead (records
    gone): refuse rather than guess."""
    import producer.publisher as publisher_module
    from producer.errors import ResumeMismatch
    from tests.producer.helpers import produce

    path = _dataset(tmp_path, 300)
    first, _ = produce(settings, run_id, [path])
    assert first.published == 300

    monkeypatch.setattr(publisher_module, "read_producer_checkpoint", lambda *_: None)
    again, printed = produce(settings, run_id, [path])
    assert again.published == 0 and "nothing to publish" in printed

    from schemas.progress import ProducerCheckpoint

    ahead = ProducerCheckpoint(run=run_id, next_seq=400, total=300)
    monkeypatch.setattr(publisher_module, "read_producer_checkpoint", lambda *_: ahead)
    with pytest.raises(ResumeMismatch, match="refusing"):
        produce(settings, run_id, [path])
    assert_exactly_once(settings, run_id, 300)
