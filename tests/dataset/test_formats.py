"""Each export format read back the way its consumers read it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ops.export import formats
from ops.export.shards import open_shard
from producer.formats import decode as decode_record
from producer.formats import normalize
from producer.tools import split_tool_calls
from schemas import SpecStats, TrainingSample, Usage
from schemas.messages import FunctionCall, Message, ToolCall
from schemas.sample import GeneratedTurn

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look up",
                                         "parameters": {"type": "object", "properties": {
                                             "q": {"type": "string"}}}}}


def sample(i: int, *, tools: bool = False, reasoning: str | None = "Let me think.\nOK.",
           content: str | None = "The answer.", calls: bool = False,
           history: bool = False) -> TrainingSample:
    messages: tuple[Message, ...] = (Message("system", "Be brief."),
                                     Message("user", f"Question {i}?"))
    if history:
        messages += (
            Message("assistant", None, (ToolCall(FunctionCall("lookup", '{"q": "x"}'), "c1"),)),
            Message("tool", '{"r": 1}', tool_call_id="c1"),
            Message("assistant", "Found it."), Message("user", "And then?"))
    return TrainingSample(
        id=f"{i:032x}", run="r", settings_hash="h" * 16, messages=messages,
        completion=GeneratedTurn(
            content=content, reasoning_content=reasoning,
            tool_calls=(ToolCall(FunctionCall("lookup", '{"q": "y"}'), "c2"),) if calls else None),
        finish_reason="tool_calls" if calls else "stop", source="s.jsonl", category="tools",
        usage=Usage(prompt_tokens=20, completion_tokens=60, reasoning_tokens=30),
        spec=SpecStats(accept_length=2.5, verify_ct=24), tools=(TOOL,) if tools else None,
        model="m")


VARIANTS = [sample(1), sample(2, tools=True, calls=True, content=None),
            sample(3, reasoning=None), sample(4, tools=True, history=True, calls=True),
            sample(5, content="\nleading newline", reasoning="\n\nspaced\n")]


def qwen3_split(content: str) -> tuple[str, str]:
    """How the Qwen3 chat template reads an assistant message whose content
    holds the reasoning: (reasoning, content) around `</think>`."""
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def specforge_rows(data: bytes) -> list[dict]:
    """Each line as SpecForge's `safe_conversations_generator` yields it:
    conversations with every message's fields, tools parsed from JSON text."""
    rows = []
    for line in data.decode().splitlines():
        row = json.loads(line)
        assert isinstance(row["conversations"], list)
        tools = row.get("tools")
        rows.append({"conversations": row["conversations"],
                     "tools": json.loads(tools) if isinstance(tools, str) else tools})
    return rows


def test_openai_keeps_the_chat_as_stored() -> None:
    for s in VARIANTS:
        row = json.loads(formats.openai_line(s))
        assert row["id"] == s.id and row["run"] == "r"
        *prompt, generated = row["messages"]
        assert [Message(**m) if "tool_calls" not in m else msgspec.convert(m, Message)
                for m in prompt] == list(s.messages)
        assert generated["role"] == "assistant"
        assert generated.get("reasoning_content") == s.completion.reasoning_content
        assert generated["content"] == s.completion.content
        assert row.get("tools") == (list(s.tools) if s.tools else None)


def test_specforge_lines_parse_like_specforge_and_keep_the_reasoning() -> None:
    data = b"".join(formats.specforge_line(s) for s in VARIANTS)
    for s, row in zip(VARIANTS, specforge_rows(data)):
        turns = row["conversations"]
        assert all(set(t) == {"role", "content"} and isinstance(t["content"], str) for t in turns)
        assert [t["role"] for t in turns] == [m.role for m in s.messages] + ["assistant"]
        assert row["tools"] == list(s.tools or ())
        text = turns[-1]["content"]
        assert text.startswith("<think>\n")
        reasoning, rest = qwen3_split(text)
        assert reasoning == (s.completion.reasoning_content or "").strip("\n")
        body = rest.split("\n<tool_call>")[0].split("<tool_call>")[0]
        assert body == (s.completion.content or "").lstrip("\n")
        # The template renders the split parts back into the same text.
        assert formats.assistant_text(body or None, s.completion.tool_calls, reasoning,
                                      generated=True) == text
        for call in s.completion.tool_calls or ():
            assert formats.tool_call_text(call) in text
    # Arrow (what `load_dataset("json")` uses) reads every line with one schema.
    table = pajson.read_json(io.BytesIO(data))
    assert table.num_rows == len(VARIANTS)
    assert str(table.schema.field("conversations").type) == \
        "list<item: struct<role: string, content: string>>"


def test_sharegpt_reads_back_through_tokenmills_own_reader() -> None:
    for s in VARIANTS:
        line = formats.sharegpt_line(s)
        row = json.loads(line)
        assert {t["from"] for t in row["conversations"]} <= {"system", "human", "gpt",
                                                              "observation"}
        # Read as a prompt (the reader keeps the conversation up to its last
        # user turn): the prompt comes back as it was.
        normalized = normalize(decode_record(line), "structured")
        assert normalized.format == "sharegpt"
        assert tuple(m.content for m in normalized.messages) == \
            tuple(m.content for m in s.messages)
        assert [m.role for m in normalized.messages] == [m.role for m in s.messages]
        assert [[c.function for c in m.tool_calls or ()] for m in normalized.messages] == \
            [[c.function for c in m.tool_calls or ()] for m in s.messages]
        assert (normalized.tools or None) == s.tools
        # The generated turn: its tool calls parse back with the Hermes parser.
        last = row["conversations"][-1]
        assert last["from"] == "gpt" and last["value"].startswith("<think>\n")
        split = split_tool_calls(last["value"], 0)
        calls = split[1] if split is not None else ()
        assert [c.function for c in calls] == [c.function for c in s.completion.tool_calls or ()]


def test_parquet_round_trip(tmp_path: Path) -> None:
    writer = open_shard(tmp_path / "x.parquet", "parquet")
    for s in VARIANTS:
        writer.add(s)
    size, digest = writer.finish()
    assert size == (tmp_path / "x.parquet").stat().st_size
    rows = pq.read_table(tmp_path / "x.parquet").to_pylist()
    assert [r["id"] for r in rows] == [s.id for s in VARIANTS]
    for s, r in zip(VARIANTS, rows):
        assert r["reasoning_content"] == s.completion.reasoning_content
        assert r["content"] == s.completion.content
        assert [m["role"] for m in r["messages"]] == [m.role for m in s.messages]
        assert [m["content"] for m in r["messages"]] == [m.content for m in s.messages]
        assert (json.loads(r["tools"]) if r["tools"] else None) == \
               (list(s.tools) if s.tools else None)
        assert r["completion_tokens"] == 60 and r["accept_length"] == 2.5
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in r["tool_calls"] or ()]
        assert calls == [(c.function.name, c.function.arguments)
                         for c in s.completion.tool_calls or ()]


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_a_shard_is_the_same_bytes_every_time(tmp_path: Path, fmt: str) -> None:
    digests = set()
    for attempt in range(2):
        writer = open_shard(tmp_path / f"{attempt}.out", fmt)
        for s in VARIANTS * 3:
            writer.add(s)
        digests.add(writer.finish()[1])
    assert len(digests) == 1


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(reasoning=st.one_of(st.none(), text), content=st.one_of(st.none(), text))
def test_the_qwen3_rendering_splits_back_into_reasoning_and_answer(reasoning, content) -> None:
    if "</think>" in (reasoning or "") + (content or "") or "<think>" in (content or ""):
        return  # text that itself holds the tags is ambiguous to the template too
    rendered = formats.assistant_text(content, None, reasoning, generated=True)
    back_reasoning, back_content = qwen3_split(rendered)
    assert back_reasoning == (reasoning or "").strip("\n")
    assert back_content == (content or "").lstrip("\n")
