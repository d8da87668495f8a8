"""Publishing against the real broker, read back with kafka-python: the mix in
every stretch of every partition, balance, the stored spec, re-runs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from producer.synthetic import record, write_jsonl
from schemas.run import GenerationSettings
from tests.producer.helpers import (
    assert_exactly_once,
    checkpoint,
    produce,
    prompts,
    run_cli,
    values,
)
from tokenmill.registry import RunConflict, RunRegistry

pytestmark = pytest.mark.broker


def _files(tmp_path: Path) -> tuple[Path, Path]:
    import random

    rng = random.Random(3)
    plain = tmp_path / "plain.jsonl"
    write_jsonl(plain, [record("prompt", i, rng, 12) for i in range(1000)])
    tools = tmp_path / "tools.jsonl"
    write_jsonl(tools, [record("openai-tools", 5000 + i, rng, 12) for i in range(100)])
    return plain, tools


def test_every_tenth_of_every_partition_holds_tool_prompts_at_their_rate(
        settings, run_id, tmp_path: Path) -> None:
    """The seed run appended tool prompts last; here 1,000 plain prompts in one
    file and 100 tool prompts after them in another still mix everywhere."""
    plain, tools = _files(tmp_path)
    outcome, _ = produce(settings, run_id, [plain, tools], partitions=4)
    assert outcome.published == outcome.total == 1100
    records = prompts(settings, run_id)
    rate = 100 / 1100
    for p in range(4):
        sequence = [json.loads(r.value)["category"] for r in records if r.partition == p]
        assert len(sequence) == 275
        for tenth in range(10):
            part = sequence[tenth * len(sequence) // 10:(tenth + 1) * len(sequence) // 10]
            share = part.count("tools") / len(part)
            assert rate / 2 <= share <= rate * 2, (p, tenth, share)


def test_partition_counts_differ_by_at_most_one_and_keys_are_ids(
        settings, run_id, tmp_path: Path) -> None:
    path = tmp_path / "odd.jsonl"
    write_jsonl(path, [{"prompt": f"question {i}"} for i in range(1001)])
    produce(settings, run_id, [path], partitions=6)
    records = prompts(settings, run_id)
    counts = Counter(r.partition for r in records)
    assert sorted(counts.values()) == [166, 167, 167, 167, 167, 167]
    for r in records:
        value = json.loads(r.value)
        assert r.key.decode() == value["id"]
        assert r.partition == value["seq"] % 6
    cp = checkpoint(settings, run_id)
    assert cp is not None and sorted(cp["per_partition"]) == sorted(counts.values())


def test_the_run_spec_records_settings_and_input_fingerprints(
        settings, run_id, tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    write_jsonl(path, [{"prompt": "hello"}])
    result = run_cli(settings, run_id, [path], "--partitions-per-gpu", "3", "--model", "qwen",
                     "--max-tokens", "4096", "--temperature", "0.7", "--top-p", "0.8",
                     "--top-k", "40", "--seed", "11", "--no-thinking", "--tools", "as-given",
                     "--multi-turn", "strip-assistant", "--dlq-reasons", "length,empty",
                     "--estimate-rps", "10", "--estimate-output-tokens", "2400",
                     "--parent-run", "base", "--s3-compression", "zstd")
    assert result.returncode == 0, result.stderr
    spec = RunRegistry(settings).get(run_id)
    assert spec.partitions == 3
    assert spec.generation == GenerationSettings(
        model="qwen", max_tokens=4096, temperature=0.7, top_p=0.8, top_k=40, seed=11,
        enable_thinking=False, tools="as-given")
    assert spec.multi_turn == "strip-assistant"
    assert spec.qa.dlq_reasons == ("empty", "length")
    assert spec.estimate is not None and spec.estimate.requests_per_s == 10
    assert spec.parent_run == "base"
    assert spec.s3 is not None and spec.s3.bucket == settings.s3_bucket
    assert spec.s3.compression == "zstd"
    import hashlib

    assert [(f.name, f.size, f.sha256) for f in spec.inputs] == [
        ("p.jsonl", path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())]


def test_a_finished_run_publishes_nothing_again_and_says_so(
        settings, run_id, tmp_path: Path) -> None:
    plain, tools = _files(tmp_path)
    first, _ = produce(settings, run_id, [plain, tools])
    again, printed = produce(settings, run_id, [plain, tools])
    assert first.published == 1100
    assert again.published == 0 and again.already_done
    cp = checkpoint(settings, run_id)
    assert cp is not None
    assert cp["by_category"] == {"plain": 1000, "tools": 100}
    assert cp["by_source"] == {"plain.jsonl": 1000, "tools.jsonl": 100}
    assert cp["rejected"] == 0 and cp["duplicates"] == 0
    assert "nothing to publish (0 published)" in printed
    assert_exactly_once(settings, run_id, 1100)


def test_other_settings_or_inputs_under_the_same_run_id_are_refused(
        settings, run_id, tmp_path: Path) -> None:
    plain, tools = _files(tmp_path)
    produce(settings, run_id, [plain])
    with pytest.raises(RunConflict, match="generation.max_tokens: 8192 -> 4096"):
        produce(settings, run_id, [plain], generation=GenerationSettings(max_tokens=4096))
    with pytest.raises(RunConflict, match="inputs"):
        produce(settings, run_id, [plain, tools])
    assert len(prompts(settings, run_id)) == 1000


def test_per_user_turn_publishes_one_prompt_per_turn(settings, run_id, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    write_jsonl(path, [{"conversations": [
        {"from": "human", "value": f"q{i}a"}, {"from": "gpt", "value": "a"},
        {"from": "human", "value": f"q{i}b"}, {"from": "gpt", "value": "b"}]} for i in range(10)])
    outcome, _ = produce(settings, run_id, [path], multi_turn="per-user-turn")
    assert outcome.total == 20
    records = values(prompts(settings, run_id))
    assert Counter(r["turn"] for r in records) == {0: 10, 1: 10}
    assert Counter(r["category"] for r in records) == {"plain": 10, "multi-turn": 10}
    assert RunRegistry(settings).get(run_id).multi_turn == "per-user-turn"
