"""Redrive on the real broker, in-process: which dead letters become the
child's prompts, how they are published, and when a redrive is refused."""

from __future__ import annotations

from collections import Counter
from io import StringIO
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Producer
from rich.console import Console

from ops.redrive import RedriveRefused, parse_reasons, redrive_spec, run_redrive, spool_dead_letters
from producer.errors import ProducerError
from producer.spool import SpoolReader, SpoolWriter, bucket_path
from schemas import (
    Completion,
    DeadLetter,
    Failure,
    GenerationSettings,
    Message,
    PromptRecord,
    RunSpec,
)
from schemas.dlq import HEADER_REASON
from schemas.progress import ProducerCheckpoint, SinkProgress, producer_key, sink_key
from tests.consumer.pipeline import create_run
from tests.kafka_helpers import read_all
from tokenmill.kafka import topics
from tokenmill.registry import RunRegistry

pytestmark = [pytest.mark.broker]

REASONS = ["length", "empty", "length", "failed", "length", "trivial"]


def letter(parent: str, i: int, reason: str, category: str = "plain") -> DeadLetter:
    prompt = PromptRecord(id=f"{i:032x}", run=parent, messages=(Message("user", f"Q{i}"),),
                          source=f"src{i % 2}.jsonl", format="openai", category=category,
                          line=i + 1, seq=i)
    record: Completion | Failure
    if reason == "failed":
        record = Failure(id=prompt.id, run=parent, settings_hash="h", prompt=prompt,
                         failure="timeout", error="timed out")
    else:
        record = Completion(id=prompt.id, run=parent, settings_hash="h", prompt=prompt,
                            finish_reason="length" if reason == "length" else "stop",
                            content="x" if reason != "empty" else "")
    return DeadLetter(id=prompt.id, run=parent, reason=reason, detail="", source_topic="t",
                      source_partition=0, source_offset=i, record=record)


def finished_parent(settings, run_id: str, letters: list[DeadLetter], total: int) -> RunSpec:
    """A run whose sink is done, with these dead letters committed on its DLQ."""
    spec = create_run(settings, run_id, partitions=3, max_tokens=64)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for n, dl in enumerate(letters):
        producer.produce(topics.dlq_topic(run_id), key=dl.id.encode(),
                         value=msgspec.json.encode(dl),
                         headers=[(HEADER_REASON, dl.reason.encode())],
                         partition=n % 3)
    progress = topics.progress_topic(run_id)
    producer.produce(progress, key=producer_key(run_id).encode(), value=msgspec.json.encode(
        ProducerCheckpoint(run=run_id, next_seq=total, total=total, done=True)))
    producer.produce(progress, key=sink_key(run_id, "s").encode(), value=msgspec.json.encode(
        SinkProgress(run=run_id, instance="s", s3_records=total - len(letters),
                     dlq_records=len(letters))))
    assert producer.flush(30) == 0
    return spec


def quiet() -> dict:
    return {"out": Console(file=StringIO(), width=200), "err": Console(file=StringIO())}


def test_spooling_keeps_the_chosen_reasons_once_each(tmp_path: Path) -> None:
    letters = [letter("p", i, r, "tools" if i % 3 else "plain") for i, r in enumerate(REASONS)]
    letters.append(letter("p", 0, "length"))  # the same prompt twice
    values = [(dl.reason, msgspec.json.encode(dl)) for dl in letters]
    spool = SpoolWriter(tmp_path / "spool")
    spooled = spool_dead_letters(values, ("failed", "length"), "child", spool)
    spool.close()
    assert spooled.total == 4 and spooled.duplicates == 1
    assert spooled.by_reason == Counter({"length": 3, "failed": 1})
    ids = []
    for bucket, count in enumerate(spooled.bucket_counts):
        reader = SpoolReader(bucket_path(tmp_path / "spool", bucket))
        for _ in range(count):
            line = reader.next()
            record = msgspec.json.decode(line[32:-1] + b',"seq":0,"v":1}', type=PromptRecord)
            assert record.run == "child" and record.id == line[:32].decode()
            ids.append(record.id)
        reader.close()
    assert sorted(ids) == sorted(f"{i:032x}" for i in (0, 2, 3, 4))
    # A short id cannot go through the producer's spool: a clear error.
    odd = letter("p", 9, "length")
    odd = msgspec.structs.replace(odd, record=msgspec.structs.replace(
        odd.record, prompt=msgspec.structs.replace(odd.record.prompt, id="p9")))
    with pytest.raises(ProducerError, match="p9"):
        spool_dead_letters([("length", msgspec.json.encode(odd))], ("length",), "c",
                           SpoolWriter(tmp_path / "spool2"))


def test_reasons_and_spec() -> None:
    assert parse_reasons("length, empty,length") == ("empty", "length")
    with pytest.raises(ValueError, match="bogus"):
        parse_reasons("length,bogus")
    parent = RunSpec(run_id="p", partitions=4, generation=GenerationSettings(max_tokens=4096))
    child = redrive_spec(parent, "c", {"max_tokens": 8192}, ("length",))
    assert child.parent_run == "p" and child.prompts_topic is None
    assert child.origin.kind == "redrive" and child.origin.reasons == ("length",)
    assert child.generation.max_tokens == 8192 and child.partitions == 4


def test_redrive_publishes_the_dead_letters_as_a_run_of_their_own(settings, run_id) -> None:
    letters = [letter(run_id, i, "length" if i % 4 else "trivial",
                      ("plain", "tools", "multi-turn")[i % 3]) for i in range(60)]
    finished_parent(settings, run_id, letters, total=200)
    child = f"{run_id}-8k"
    outcome = run_redrive(settings, run_id, child, {"max_tokens": 128}, ("length",),
                          transaction_records=7, **quiet())
    assert outcome.total == outcome.published == 45
    records = read_all(settings.bootstrap_servers, topics.prompts_topic(child))
    prompts = [msgspec.json.decode(r.value, type=PromptRecord) for r in records]
    assert sorted(p.id for p in prompts) == sorted(dl.id for dl in letters if dl.reason == "length")
    assert {p.run for p in prompts} == {child}
    assert sorted(p.seq for p in prompts) == list(range(45))
    assert Counter(r.partition for r in records) == Counter({0: 15, 1: 15, 2: 15})
    spec = RunRegistry(settings).get(child)
    assert spec.generation.max_tokens == 128 and spec.origin.reasons == ("length",)
    again = run_redrive(settings, run_id, child, {"max_tokens": 128}, ("length",), **quiet())
    assert again.already_done and again.published == 0
    assert len(read_all(settings.bootstrap_servers, topics.prompts_topic(child))) == 45


def test_a_redrive_that_finds_nothing_creates_no_run(settings, run_id) -> None:
    finished_parent(settings, run_id, [letter(run_id, 1, "length")], total=10)
    with pytest.raises(RedriveRefused, match="nothing to redrive"):
        run_redrive(settings, run_id, f"{run_id}-x", {}, ("empty",), **quiet())
    assert RunRegistry(settings).find(f"{run_id}-x") is None


def test_an_unfinished_parent_is_refused(settings, run_id) -> None:
    create_run(settings, run_id, partitions=1)
    with pytest.raises(RedriveRefused, match="not finished"):
        run_redrive(settings, run_id, f"{run_id}-x", {}, ("length",), **quiet())
