"""`tokenmill spot-check` on a real run: worker, sink, broker and S3."""

from __future__ import annotations

import json
import re

import msgspec
import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from schemas import Message, PromptRecord
from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import ConsumerProcess, create_run, make_prompts, publish
from tests.sink.sink_helpers import create_bucket, run_sink_in_process, s3_objects
from tokenmill.cli import cli
from tokenmill.kafka import topics
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker]

HOSTILE = {
    "markup": "[bold]x[/bold] and [red]not red[/]",
    "brackets": "[general] this that",
    "instruct": "<s>[INST] hi [/INST]",
    "ansi": "\x1b[31mred\x1b[0m alert\x07",
    "long": "long " * 3000,
}


def _spot_check(settings: Settings, *args: str) -> Result:
    return CliRunner().invoke(cli, ["spot-check", *args,
                                    "--bootstrap-servers", settings.bootstrap_servers,
                                    "--s3-endpoint-url", settings.s3_endpoint_url or "",
                                    "--s3-bucket", settings.s3_bucket or ""],
                              env={"COLUMNS": "400"})


def _produce_raw(settings: Settings, run_id: str, items: dict[str, bytes]) -> None:
    """Records no msgspec encoder would write, committed before the prompts."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers,
                         "transactional.id": f"raw-{run_id}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i, (key, value) in enumerate(items.items()):
        producer.produce(topics.prompts_topic(run_id), key=key.encode(), value=value,
                         partition=i % 2)
    producer.commit_transaction(30)


def _run(settings: Settings, run_id: str, tmp_path, prompts: list[PromptRecord]):  # type: ignore[no-untyped-def]
    spec = create_run(settings, run_id, partitions=2)
    surrogate = PromptRecord(id="surrogate", run=run_id, source="hostile.jsonl", format="plain",
                             category="plain", messages=(Message(role="user", content="SURR"),))
    _produce_raw(settings, run_id, {
        # JSON's "\ud800" (msgspec refuses a lone surrogate: the worker dead-letters it)
        "surrogate": msgspec.json.encode(surrogate).replace(b"SURR", b"bad \\ud800 text"),
        "bad-utf8": b'{"id": "x\xff[/INST]"}',
    })
    publish(settings, spec, prompts)
    # Answers shorter than max_tokens (256): nothing is dead-lettered as `length`.
    with running_simulator(SimulatorConfig(zero_delay=True, length_median=60, length_min=40,
                                           length_max=120, tool_call_parser="qwen25")) as url:
        worker = ConsumerProcess(settings, run_id, url, "s0", tmp_path, "--until-done").start()
        try:
            assert worker.wait(120) == 0, worker.log()[-3000:]
        finally:
            worker.stop()
    return spec


def _hostile_prompts(run_id: str) -> list[PromptRecord]:
    normal = make_prompts(run_id, 30, tools_every=3)
    hostile = [PromptRecord(id=f"h-{name}", run=run_id, source="hostile.jsonl", format="plain",
                            category="plain", line=i + 1, seq=len(normal) + i,
                            messages=(Message(role="user", content=text),))
               for i, (name, text) in enumerate(HOSTILE.items())]
    return normal + hostile


def test_spot_check_shows_dataset_text_verbatim_and_where_records_go(settings, run_id,
                                                                     tmp_path) -> None:
    prompts = _hostile_prompts(run_id)
    spec = _run(settings, run_id, tmp_path, prompts)

    # Before the sink ran: no bucket, then an empty one.
    result = _spot_check(settings, "--run", run_id, "--source", "hostile.jsonl", "-n", "1")
    assert result.exit_code == 0, result.output
    assert f"S3 (key unknown: no bucket {settings.s3_bucket})" in result.output
    create_bucket(settings)
    result = _spot_check(settings, "--run", run_id, "--source", "hostile.jsonl", "-n", "1")
    assert result.exit_code == 0, result.output
    assert "S3 (not yet persisted)" in result.output

    run_sink_in_process(settings, spec, batch_size=7)
    result = _spot_check(settings, "--run", run_id, "--source", "hostile.jsonl", "-n", "10",
                         "--width", "200")
    out = result.output
    assert result.exit_code == 0, out
    assert out.count("(plain, hostile.jsonl:") == len(HOSTILE)
    for text in ("[bold]x[/bold] and [red]not red[/]", "[general] this that",
                 "<s>[INST] hi [/INST]", "\\x1b[31mred\\x1b[0m alert\\x07"):
        assert text in out
    assert "\x1b" not in out and "\x07" not in out
    assert "long " * 39 + "long…" in out and "long " * 41 not in out
    # Each record names the object that really holds it (or its dead-letter reason).
    holding = {line["id"]: obj.key for obj in s3_objects(settings) for line in obj.lines}
    blocks = dict(re.findall(r"(h-\w+) \(plain, (.*?)(?=h-\w+ \(plain, |\Z)", out, re.S))
    assert set(blocks) == {f"h-{name}" for name in HOSTILE}
    for record_id, block in blocks.items():
        if record_id in holding:
            shown = re.search(r"S3: (\S+)", block)
            assert shown is not None and shown.group(1) == holding[record_id], block
        else:
            assert "dead-letter topic: " in block, block
    assert any(re.search(rf"S3: {run_id}/partition=\d{{4}}/offset=\d{{20}}\.jsonl", b)
               for b in blocks.values())

    # Dead letters: the reason, and the record as read with bad bytes escaped.
    result = _spot_check(settings, "--run", run_id, "--reason", "invalid", "-n", "5")
    assert result.exit_code == 0, result.output
    assert result.output.count("dead-letter topic: invalid") == 2
    assert "bad \\ud800 text" in result.output
    assert '{"id": "x\\udcff[/INST]"}' in result.output
    assert "S3" not in result.output.replace("dead-letter", "")


def test_spot_check_filters_and_summary(settings, run_id, tmp_path) -> None:
    prompts = _hostile_prompts(run_id)
    _run(settings, run_id, tmp_path, prompts)

    result = _spot_check(settings, "--run", run_id, "--category", "tools", "-n", "2")
    assert result.exit_code == 0, result.output
    assert result.output.count("(tools, test.jsonl") == 2
    assert "tools offered" in result.output and "get_weather" in result.output
    assert "user → assistant (generated)" in result.output

    # AND: plain prompts of test.jsonl only; none of hostile.jsonl, none of tools.
    result = _spot_check(settings, "--run", run_id, "--category", "plain", "--source",
                         "test.jsonl", "-n", "50")
    assert result.exit_code == 0, result.output
    assert result.output.count("(plain, test.jsonl") == 20
    assert "hostile.jsonl" not in result.output and "(tools," not in result.output
    result = _spot_check(settings, "--run", run_id, "--reason", "length", "-n", "5")
    assert result.exit_code == 0 and "no committed results with reason=length yet" in \
        result.output

    result = _spot_check(settings, "--run", run_id, "--summary", "--json", "--sample", "500")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    total = len(prompts) + 2
    assert summary["records"] == total and summary["failures"] == 2
    assert {s["name"]: s["count"] for s in summary["categories"]} == {"plain": 25, "tools": 10}
    assert {s["name"]: s["count"] for s in summary["sources"]} == {"test.jsonl": 30,
                                                                  "hostile.jsonl": 5}
    routes = {s["name"]: s["count"] for s in summary["routes"]}
    assert routes["dead-letter: invalid"] == 2 and sum(routes.values()) == total
    assert summary["tool_prompts"] == 10 and summary["tool_prompts_structured"] == 10
    assert summary["completions"] == len(prompts)
    assert 0 < summary["with_reasoning"] <= summary["completions"]
    lengths = summary["completion_tokens"]
    assert 0 < lengths["min"] <= lengths["median"] <= lengths["p95"] <= lengths["max"]

    # A smaller sample: at most that many (transaction markers take offsets too).
    result = _spot_check(settings, "--run", run_id, "--summary", "--json", "--sample", "10")
    assert result.exit_code == 0, result.output
    assert 0 < json.loads(result.output)["records"] <= 10

    result = _spot_check(settings, "--run", run_id, "--summary", "--source", "hostile.jsonl")
    assert result.exit_code == 0, result.output
    assert "Summary of 5 committed records" in result.output
    assert "source=hostile.jsonl" in result.output and "Prompts by source" in result.output
    assert "Finish reasons" in result.output and "Where records go" in result.output
