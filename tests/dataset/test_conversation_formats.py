"""A regenerate-turns conversation in each export format, read back the way
its consumers read it: every assistant message is the stored generated step
(reasoning in the format's reasoning field, never in the visible content),
tool calls and results in the format's tool roles, per-step stats beside."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

from ops.export import conversations, formats
from ops.export.shards import open_shard
from schemas import Conversation, PromptRecord, SpecStats, Step, Usage
from schemas.messages import FunctionCall, Message, ToolCall
from schemas.sample import ConversationSample
from sink.samples import conversation_sample

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look up",
                                         "parameters": {"type": "object", "properties": {
                                             "q": {"type": "string"}}}}}


def call(n: int) -> ToolCall:
    return ToolCall(FunctionCall("lookup", f'{{"q": "x{n}"}}'), f"c{n}")


def step(turn: int, n: int, *, calls: bool = False, answered: bool = True,
         reasoning: str | None = "Thinking.\nDone.") -> Step:
    results = (Message("tool", f'{{"r": {n}}}', tool_call_id=f"c{n}"),) if calls and answered \
        else ()
    return Step(turn=turn, finish_reason="tool_calls" if calls else "stop",
                content=None if calls else f"Answer {turn}.{n}", reasoning_content=reasoning,
                tool_calls=(call(n),) if calls else None, tool_results=results,
                usage=Usage(prompt_tokens=10 * (n + 1), completion_tokens=20 + n,
                            reasoning_tokens=5),
                spec=SpecStats(accept_length=2.0 + n / 10, verify_ct=7), model="m",
                carried=n == 0)


def conversation(i: int, steps: tuple[Step, ...], outcome: str = "finished",
                 users: int = 2, system: bool = True) -> ConversationSample:
    """The S3 line the sink writes for these steps (its own definition)."""
    dataset: list[Message] = [Message("system", "Be brief.")] if system else []
    for t in range(users):
        dataset += [Message("user", f"Question {i}.{t}?"),
                    Message("assistant", f"DATASET ANSWER {i}.{t}")]
    prompt = PromptRecord(id=f"{i:032x}", run="r", messages=tuple(dataset), source="s.jsonl",
                          format="openai", category="tools", tools=(TOOL,))
    record = Conversation(id=prompt.id, run="r", settings_hash="h" * 16, prompt=prompt,
                          steps=steps, outcome=outcome)  # type: ignore[arg-type]
    return conversation_sample(record)


FINISHED = [
    conversation(1, (step(0, 0), step(1, 1))),
    conversation(2, (step(0, 0, calls=True), step(0, 1), step(1, 2, reasoning=None)),
                 system=False),
    conversation(3, (step(0, 0, calls=True), step(0, 1, calls=True), step(0, 2)), users=1),
]
UNRESOLVED = conversation(4, (step(0, 0), step(1, 1, calls=True, answered=False)),
                          outcome="tool_unresolved")
AT_ONCE = conversation(5, (step(0, 0, calls=True, answered=False),), outcome="tool_limit",
                       users=1)


def assistants(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if m["role"] == "assistant"]


def calls_of(s: Step) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": c.type, "function": {"name": c.function.name,
                                                      "arguments": c.function.arguments}}
            for c in s.tool_calls or ()]


def test_openai_rows_hold_every_step_with_its_reasoning_and_stats() -> None:
    for sample in FINISHED:
        row = json.loads(conversations.openai_line(sample))
        said = assistants(row["messages"])
        assert len(said) == len(sample.steps)
        for message, s in zip(said, sample.steps):
            assert message.get("content") == s.content
            assert message.get("reasoning_content") == s.reasoning_content
            assert message.get("tool_calls", []) == calls_of(s)
        assert "DATASET ANSWER" not in json.dumps(row)
        tools = [m for m in row["messages"] if m["role"] == "tool"]
        assert tools == [{"role": "tool", "content": r.content, "tool_call_id": r.tool_call_id}
                         for s in sample.steps for r in s.tool_results]
        assert row["outcome"] == "finished" and row["tools"] == [TOOL]
        assert [(st["turn"], st["usage"]["completion_tokens"], st["spec"]["accept_length"])
                for st in row["steps"]] == [(s.turn, s.usage.completion_tokens,
                                             s.spec.accept_length) for s in sample.steps]
        assert row["steps"][0]["carried"] is True and "carried" not in row["steps"][1]


def load_like_specforge(data: bytes) -> list[dict[str, Any]]:
    """SpecForge's `safe_conversations_generator` (list and dict values made
    JSON text, `tools` parsed) and its parser's `_sanitize_message` (keys it
    knows; `tool_calls` JSON text parsed, each call's arguments parsed)."""
    rows = []
    for line in data.decode().splitlines():
        row = json.loads(line)
        messages = []
        for message in row["conversations"]:
            message = {k: json.dumps(v) if isinstance(v, (list, dict)) else v
                       for k, v in message.items()}
            message = {k: v for k, v in message.items() if k in {
                "role", "content", "tool_calls", "reasoning_content", "name", "tool_call_id"}}
            if isinstance(message.get("tool_calls"), str):
                message["tool_calls"] = [
                    {"id": c.get("id", ""), "type": c.get("type", "function"),
                     "function": {"name": c["function"]["name"],
                                  "arguments": json.loads(c["function"]["arguments"])}}
                    for c in json.loads(message["tool_calls"])]
            messages.append(message)
        rows.append({"conversations": messages, "tools": json.loads(row["tools"])})
    return rows


def qwen3_render(messages: list[dict[str, Any]]) -> str:
    """What the Qwen3 (thinking) chat template makes of the messages, for the
    parts training reads: reasoning shown on the assistant turns after the
    last user message, tool calls as `<tool_call>` blocks with the arguments
    as JSON, consecutive tool results in one user turn."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    out = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role == "assistant":
            text = m["content"]
            if i > last_user:
                text = ("<think>\n" + m["reasoning_content"].strip("\n") + "\n</think>\n\n"
                        + text.lstrip("\n"))
            for n, c in enumerate(m.get("tool_calls") or ()):
                if n or m["content"]:
                    text += "\n"
                text += ('<tool_call>\n{"name": "' + c["function"]["name"] + '", "arguments": '
                         + json.dumps(c["function"]["arguments"]) + "}\n</tool_call>")
            out.append(f"<|im_start|>assistant\n{text}<|im_end|>\n")
        elif role == "tool":
            first = i == 0 or messages[i - 1]["role"] != "tool"
            last = i + 1 == len(messages) or messages[i + 1]["role"] != "tool"
            out.append(("<|im_start|>user" if first else "") + "\n<tool_response>\n"
                       + m["content"] + "\n</tool_response>" + ("<|im_end|>\n" if last else ""))
        else:
            out.append(f"<|im_start|>{role}\n{m['content']}<|im_end|>\n")
    return "".join(out)


def assistant_blocks(text: str) -> list[str]:
    return [part.split("<|im_end|>")[0] for part in text.split("<|im_start|>assistant\n")[1:]]


def test_specforge_rows_load_like_specforge_and_render_the_stored_turns() -> None:
    data = b"".join(conversations.specforge_line(s) for s in FINISHED)
    for sample, row in zip(FINISHED, load_like_specforge(data)):
        messages = row["conversations"]
        assert row["tools"] == [TOOL]
        said = assistants(messages)
        assert [(m["content"], m["reasoning_content"]) for m in said] == \
            [(s.content or "", s.reasoning_content or "") for s in sample.steps]
        assert all("<think>" not in m["content"] for m in messages)
        assert [[(c["function"]["name"], json.dumps(c["function"]["arguments"]))
                 for c in m["tool_calls"]] for m in said] == \
            [[(c.function.name, c.function.arguments) for c in s.tool_calls or ()]
             for s in sample.steps]
        assert [m["content"] for m in messages if m["role"] == "tool"] == \
            [r.content for s in sample.steps for r in s.tool_results]
        # The template applied gives back each stored turn as tokenmill
        # renders it (the ShareGPT rows hold the same text).
        rendered = assistant_blocks(qwen3_render(messages))
        gpt = [t["value"] for t in json.loads(conversations.sharegpt_line(sample))
               ["conversations"] if t["from"] == "gpt"]
        assert rendered == gpt
        last_user = max(i for i, m in enumerate(sample.messages) if m.role == "user")
        positions = [i for i, m in enumerate(sample.messages) if m.role == "assistant"]
        assert rendered == [formats.assistant_text(s.content, s.tool_calls, s.reasoning_content,
                                                   generated=p > last_user)
                            for s, p in zip(sample.steps, positions)]
    # Arrow (what `load_dataset("json")` uses) reads every line with one schema.
    table = pajson.read_json(io.BytesIO(data))
    assert str(table.schema.field("conversations").type) == (
        "list<item: struct<role: string, content: string, reasoning_content: string, "
        "tool_calls: string, tool_call_id: string>>")


def test_sharegpt_rows_use_the_formats_roles() -> None:
    for sample in FINISHED:
        row = json.loads(conversations.sharegpt_line(sample))
        assert [t["from"] for t in row["conversations"]] == [
            formats.SHAREGPT_ROLES[m.role] for m in sample.messages]
        assert "DATASET ANSWER" not in json.dumps(row)
        assert json.loads(row["tools"]) == [TOOL]


def test_parquet_rows_read_back_with_pyarrow(tmp_path: Path) -> None:
    writer = open_shard(tmp_path / "c.parquet", "parquet", conversation_rows=True)
    for sample in FINISHED:
        writer.add(sample)
    writer.finish()
    rows = pq.read_table(tmp_path / "c.parquet").to_pylist()
    assert [r["id"] for r in rows] == [s.id for s in FINISHED]
    for sample, row in zip(FINISHED, rows):
        said = assistants(row["messages"])
        assert [(m["content"], m["reasoning_content"], calls_of_row(m)) for m in said] == \
            [(s.content, s.reasoning_content, calls_of(s)) for s in sample.steps]
        assert [m["role"] for m in row["messages"]] == [m.role for m in sample.messages]
        assert row["turns"] == len({s.turn for s in sample.steps})
        assert [(st["turn"], st["completion_tokens"], st["accept_length"], st["carried"])
                for st in row["steps"]] == [(s.turn, s.usage.completion_tokens,
                                             s.spec.accept_length, s.carried)
                                            for s in sample.steps]
        assert row["completion_tokens"] == sum(s.usage.completion_tokens for s in sample.steps)
        assert row["outcome"] == "finished" and json.loads(row["tools"]) == [TOOL]


def calls_of_row(message: dict[str, Any]) -> list[dict[str, Any]]:
    return message["tool_calls"] or []


def test_partial_conversations_are_cut_after_their_last_complete_turn() -> None:
    assert conversations.exportable(FINISHED[0], False) is FINISHED[0]
    assert conversations.exportable(UNRESOLVED, False) is None
    cut = conversations.exportable(UNRESOLVED, True)
    assert cut is not None and cut.steps == UNRESOLVED.steps[:1]
    assert [m.role for m in cut.messages] == ["system", "user", "assistant"]
    assert cut.messages[-1].content == UNRESOLVED.steps[0].content
    assert conversations.exportable(AT_ONCE, True) is None  # no turn complete
    row = json.loads(conversations.openai_line(cut))
    assert row["outcome"] == "tool_unresolved" and len(row["steps"]) == 1


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_a_shard_counts_rows_and_the_partial_conversations(tmp_path: Path, fmt: str) -> None:
    for include in (False, True):
        writer = open_shard(tmp_path / f"{fmt}-{include}", fmt, conversation_rows=True,
                            include_partial=include)
        for sample in (*FINISHED, UNRESOLVED, AT_ONCE):
            writer.add(sample)
        writer.finish()
        stats = writer.runs["r"]
        assert writer.results == 5
        assert (writer.records, writer.left_out) == ((4, 1) if include else (3, 2))
        assert (stats.records, stats.partial, stats.left_out) == \
            ((4, 1, 1) if include else (3, 0, 2))
        assert stats.turns == 2 + 3 + 3 + (1 if include else 0)


def test_messages_and_steps_that_disagree_are_refused() -> None:
    sample = FINISHED[0]
    broken = ConversationSample(**{**{f: getattr(sample, f) for f in sample.__struct_fields__},
                                   "steps": sample.steps[:1]})
    with pytest.raises(conversations.InconsistentConversation):
        conversations.openai_line(broken)
