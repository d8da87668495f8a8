"""Bad input: each bad record is rejected with file, line and reason, every
good record around it is published, and file-level problems fail clearly
before anything is created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producer.errors import NothingToPublish
from tests.producer.helpers import produce, prompts, run_cli, values
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry

pytestmark = pytest.mark.broker


def good(n: int) -> bytes:
    return json.dumps({"prompt": f"good prompt {n}"}).encode()


# (record, reason); the big ones are built when a file is written, not held here.
BAD_LINES: list[tuple[bytes | int, str]] = [
    (b'{"conversations": [{"from": "human", "value": "unclosed"}', "invalid-json"),
    (b'{"conversations": [{"from": "human", "value": 12}]}', "wrong-type"),
    (b'{"messages": {"role": "user"}}', "wrong-type"),
    (b'{"conversations": []}', "empty-conversation"),
    (b'{"conversations": [{"from": "narrator", "value": "Once upon a time"}]}', "unknown-role"),
    (b'{"conversations": [{"from": "system", "value": "s"}, {"from": "gpt", "value": "a"}]}',
     "no-user-turn"),
    (b'{"prompt": "caf\xe9 au lait"}', "invalid-utf8"),
    (b'{"prompt": "nul\x00byte"}', "nul-character"),
    (b'{"prompt": "escaped nul \\u0000 here"}', "nul-character"),
    (50 * 1024 * 1024, "too-large"),  # a 50 MB line
    (9 * 1024 * 1024, "too-large"),  # over Kafka's 8 MB limit
]


def _bad_file(tmp_path: Path) -> Path:
    """good, bad, good, bad, ... good: each bad record has good neighbours."""
    path = tmp_path / "bad.jsonl"
    with path.open("wb") as fh:
        fh.write(good(0) + b"\n")
        for i, (bad, _) in enumerate(BAD_LINES, start=1):
            if isinstance(bad, int):
                fh.write(b'{"prompt": "' + b"x" * bad + b'"}')
            else:
                fh.write(bad)
            fh.write(b"\n" + good(i) + b"\n")
    return path


def test_each_bad_record_is_rejected_and_its_neighbours_published(
        settings, run_id, tmp_path: Path) -> None:
    path = _bad_file(tmp_path)
    outcome, printed = produce(settings, run_id, [path])
    assert outcome.total == outcome.published == len(BAD_LINES) + 1

    published = values(prompts(settings, run_id))
    assert sorted(r["line"] for r in published) == list(range(1, 2 * len(BAD_LINES) + 2, 2))
    assert sorted(r["messages"][0]["content"] for r in published) == sorted(
        f"good prompt {i}" for i in range(len(BAD_LINES) + 1))

    assert outcome.rejects_path is not None
    rejects = [json.loads(line) for line in outcome.rejects_path.read_text().splitlines()]
    assert [(r["file"], r["line"], r["reason"]) for r in rejects] == [
        ("bad.jsonl", 2 * i, reason) for i, (_, reason) in enumerate(BAD_LINES, start=1)]
    assert all(r["detail"] for r in rejects)
    assert all(len(r["excerpt"]) <= 200 for r in rejects)
    assert "rejected records" in printed and "too-large" in printed


def test_strict_stops_at_the_first_bad_record_naming_it(settings, run_id, tmp_path: Path) -> None:
    path = _bad_file(tmp_path)
    result = run_cli(settings, run_id, [path], "--strict")
    assert result.returncode == 1
    assert f"{path}:2: invalid-json" in result.stderr
    assert "Traceback" not in result.stderr
    assert RunRegistry(settings).find(run_id) is None  # nothing created


def test_a_missing_file_fails_before_anything_is_created(settings, run_id, tmp_path: Path) -> None:
    present = tmp_path / "present.jsonl"
    present.write_bytes(good(1) + b"\n")
    result = run_cli(settings, run_id, [present, tmp_path / "absent.jsonl"])
    assert result.returncode == 1
    assert f"input file not found: {tmp_path / 'absent.jsonl'}" in result.stderr
    assert "Traceback" not in result.stderr
    assert RunRegistry(settings).find(run_id) is None
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap_servers)
    try:
        assert topics.prompts_topic(run_id) not in consumer.topics()
    finally:
        consumer.close()


def test_an_empty_file_is_a_warning_and_the_others_are_published(
        settings, run_id, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    data = tmp_path / "data.jsonl"
    data.write_bytes(good(1) + b"\n" + good(2) + b"\n")
    outcome, printed = produce(settings, run_id, [empty, data])
    assert outcome.published == 2
    assert f"warning: {empty}: empty file, no records" in " ".join(printed.split())


def test_only_empty_or_rejected_inputs_is_an_error(settings, run_id, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"not json\n")
    with pytest.raises(NothingToPublish, match="no prompt accepted from 2 input file"):
        produce(settings, run_id, [empty, junk])
    assert RunRegistry(settings).find(run_id) is None


def test_dry_run_summarizes_without_touching_kafka(tmp_path: Path) -> None:
    """No broker at all: a dry run never connects."""
    from tokenmill.settings import Settings

    path = _bad_file(tmp_path)
    offline = Settings(bootstrap_servers="127.0.0.1:9", state_dir=tmp_path / "state",
                       connect_timeout_s=1)
    outcome, printed = produce(offline, "dry", [path], dry_run=True)
    assert outcome.published == 0 and outcome.total == len(BAD_LINES) + 1
    assert "dry run: 12 prompts would be published" in printed
    assert outcome.summary is not None and outcome.summary.rejected == len(BAD_LINES)
