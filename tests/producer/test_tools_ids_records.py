"""Tool text parsing, prompt ids, and the seq-splicing record encoding."""

from __future__ import annotations

import json

import msgspec
import pytest

from producer import records, tools
from producer.ids import SeenIds, encode_messages, prompt_id
from schemas.messages import Message
from schemas.prompt import PromptRecord

FN = {"name": "f", "description": "d", "parameters": {"type": "object"}}


def test_tool_lists_in_every_written_form() -> None:
    wrapped = {"type": "function", "function": FN}
    assert tools.parse_tool_list(json.dumps([FN])) == (wrapped,)
    assert tools.parse_tool_list(json.dumps(wrapped)) == (wrapped,)
    assert tools.parse_tool_list(json.dumps(FN) + "\n" + json.dumps(FN)) == (wrapped, wrapped)
    assert tools.parse_tool_list(repr([wrapped])) == (wrapped,)  # Python literal (Hermes v1)
    assert tools.parse_tool_list("[1, 2]") is None
    assert tools.parse_tool_list("not tools") is None
    assert tools.parse_tool_list("__import__('os')") is None


def test_hermes_block_is_cut_with_the_rest_kept() -> None:
    found = tools.find_tool_text(f"Intro.\n<tools>\n{json.dumps(FN)}\n</tools>\nOutro.")
    assert found.kind == "hermes"
    assert found.remaining == "Intro.\n\nOutro."
    assert found.tools == ({"type": "function", "function": FN},)


def test_tool_call_text_split() -> None:
    content = 'Let me check.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    remaining, calls = tools.split_tool_calls(content, 3)  # type: ignore[misc]
    assert remaining == "Let me check."
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_3", "f", '{"a": 1}')]
    assert tools.split_tool_calls("<tool_call>garbage</tool_call>", 0) is None


def test_ids_are_stable_and_ignore_dict_order() -> None:
    messages = encode_messages((Message(role="user", content="hi"),))
    a = {"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}
    b = {"function": {"parameters": {"b": 2, "a": 1}, "name": "f"}, "type": "function"}
    assert prompt_id(messages, (a,)) == prompt_id(messages, (b,))
    assert prompt_id(messages, None) != prompt_id(messages, (a,))
    pid, key = prompt_id(messages, None)
    assert len(pid) == 32 and key == int(pid[:16], 16)
    # Pinned: a change here changes every id, and a resumed run would refuse to continue.
    assert pid == "b03d228fdf33e7c81a9a7ea3eadadcf2"


def test_seen_ids() -> None:
    seen = SeenIds()
    seen.add(5)
    seen.add(5)
    assert 5 in seen and 6 not in seen and len(seen) == 1


@pytest.mark.parametrize("turn", [None, 0, 12])
@pytest.mark.parametrize("tool_list", [None, ({"type": "function", "function": {"name": "f"}},)])
def test_assembled_record_equals_a_normally_encoded_one(turn, tool_list) -> None:
    messages = (Message(role="system", content='q"uote \\ \u2603 \x01'),
                Message(role="user", content="hi"))
    record = PromptRecord(id="ab" * 16, run="run-1", messages=messages, source='dir/"odd".jsonl',
                          format="openai", category="system-prompt", line=3, turn=turn,
                          tools=tool_list)
    assembled = records.assemble(
        record.id, records.json_string(record.run), encode_messages(messages),
        records.json_string(record.source), records.json_string(record.format),
        records.json_string(record.category), record.line, turn,
        records.encode_tools(tool_list) if tool_list else b"null")
    assert assembled == records.prefix(record)
    line = records.spool_line(
        record.id.encode(), records.json_string(record.run), encode_messages(messages),
        records.json_string(record.source), records.json_string(record.format),
        records.json_string(record.category), record.line, turn,
        records.encode_tools(tool_list) if tool_list else b"null")
    assert line == record.id.encode() + assembled + b"\n"
    assert len(line) - records.SPOOL_OVERHEAD == len(assembled)
    assert records.finish_line(line, 5) == (record.id.encode(), records.finish(assembled, 5))
    for seq in (0, 7, 123_456_789):
        assert records.finish(assembled, seq) == msgspec.json.encode(
            msgspec.structs.replace(record, seq=seq))
