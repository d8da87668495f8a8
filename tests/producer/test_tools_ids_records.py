"""Tool text parsing, prompt ids, and the seq-splicing record encoding."""

from __future__ import annotations

import json

import msgspec

from producer import records, tools
from producer.ids import SeenIds, prompt_id
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
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [("call_3", "f", '{"a": 1}')]
    assert tools.split_tool_calls("<tool_call>garbage</tool_call>", 0) is None


def test_ids_are_stable_and_ignore_dict_order() -> None:
    messages = (Message(role="user", content="hi"),)
    a = {"type": "function", "function": {"name": "f", "parameters": {"a": 1, "b": 2}}}
    b = {"function": {"parameters": {"b": 2, "a": 1}, "name": "f"}, "type": "function"}
    assert prompt_id(messages, (a,)) == prompt_id(messages, (b,))
    assert prompt_id(messages, None) != prompt_id(messages, (a,))
    pid, key = prompt_id(messages, None)
    assert len(pid) == 32 and int(pid[:16], 16) == key
    # Pinned: a change here changes every id, and a resumed run would refuse to continue.
    assert pid == "93822c74aebcea621580b1b0bbf91cbe"


def test_seen_ids() -> None:
    seen = SeenIds()
    assert seen.add(5) and not seen.add(5) and 5 in seen and len(seen) == 1


def test_spliced_record_equals_a_normally_encoded_one() -> None:
    record = PromptRecord(id="x" * 32, run="r", messages=(Message(role="user", content="hi"),),
                          source="s.jsonl", format="prompt", category="plain", line=3,
                          tools=({"type": "function", "function": {"name": "f"}},))
    for seq in (0, 7, 123_456_789):
        assert records.finish(records.prefix(record), seq) == msgspec.json.encode(
            msgspec.structs.replace(record, seq=seq))
