"""Each input format -> the exact normalized messages and tools."""

from __future__ import annotations

import json

import msgspec
import pytest

from producer.formats import decode, normalize
from producer.rejects import Reject
from schemas.messages import FunctionCall, Message, ToolCall

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
STOCK_FN = {"name": "get_stock_price", "description": "Price of a stock.",
            "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}}}


def norm(record: dict | bytes, tools: str = "structured"):
    data = record if isinstance(record, bytes) else json.dumps(record).encode()
    return normalize(decode(data), tools)  # type: ignore[arg-type]


def rejected(record: dict | bytes, tools: str = "structured") -> Reject:
    with pytest.raises(Reject) as info:
        norm(record, tools)
    return info.value


def test_sharegpt_all_roles_in_order() -> None:
    n = norm({"conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Weather in Oslo?"},
        {"from": "function_call",
         "value": '{"name": "get_weather", "arguments": {"city": "Oslo"}}'},
        {"from": "observation", "value": '{"temp": -3}'},
        {"from": "gpt", "value": "It is -3."},
        {"from": "human", "value": "Thanks!"},
    ]})
    assert n.format == "sharegpt"
    assert n.tools is None
    assert n.messages == (
        Message(role="system", content="Be brief."),
        Message(role="user", content="Weather in Oslo?"),
        Message(role="assistant", tool_calls=(ToolCall(
            id="call_0",
            function=FunctionCall(name="get_weather", arguments='{"city": "Oslo"}')),)),
        Message(role="tool", content='{"temp": -3}', tool_call_id="call_0"),
        Message(role="assistant", content="It is -3."),
        Message(role="user", content="Thanks!"),
    )


def test_sharegpt_with_top_level_system_and_tools_string() -> None:
    """LLaMA-Factory style: `system` and `tools` (a JSON string) beside the turns."""
    n = norm({"system": "You help.", "tools": json.dumps([STOCK_FN]),
              "conversations": [{"from": "human", "value": "AAPL?"}, {"from": "gpt", "value": "1"},
                                {"from": "human", "value": "MSFT?"}]})
    assert n.messages == (Message(role="system", content="You help."),
                          Message(role="user", content="AAPL?"),
                          Message(role="assistant", content="1"),
                          Message(role="user", content="MSFT?"))
    assert n.tools == ({"type": "function", "function": STOCK_FN},)


def test_openai_chat_with_tool_calls_and_tool_results() -> None:
    n = norm({"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Weather in Rome and Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
            {"id": "b", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "20C"},
        {"role": "tool", "tool_call_id": "b", "content": "18C"},
        {"role": "assistant", "content": "Rome 20C, Paris 18C."},
        {"role": "user", "content": "And Oslo?"},
    ]})
    assert n.format == "openai"
    assert n.messages == (
        Message(role="system", content="sys"),
        Message(role="user", content="Weather in Rome and Paris?"),
        Message(role="assistant", tool_calls=(
            ToolCall(id="a",
                     function=FunctionCall(name="get_weather", arguments='{"city":"Rome"}')),
            ToolCall(id="b",
                     function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}')))),
        Message(role="tool", content="20C", tool_call_id="a"),
        Message(role="tool", content="18C", tool_call_id="b"),
        Message(role="assistant", content="Rome 20C, Paris 18C."),
        Message(role="user", content="And Oslo?"),
    )


def test_turns_after_the_last_user_turn_are_checked_but_not_converted() -> None:
    """No policy ever sends the final answer: it is not converted or scanned
    (a NUL in it does not cost the prompt), but its role must still be known."""
    n = norm({"conversations": [{"from": "human", "value": "hi"},
                                {"from": "gpt", "value": "bad \u0000 answer"}]})
    assert n.messages == (Message(role="user", content="hi"),)
    assert rejected({"conversations": [{"from": "human", "value": "hi"},
                                       {"from": "robot", "value": "x"}]}).reason == "unknown-role"


def test_raw_openai_request_body_keeps_tools_and_ignores_sampling_fields() -> None:
    n = norm({"model": "gpt-x", "temperature": 0.1, "tools": [WEATHER],
              "messages": [{"role": "developer", "content": "dev"},
                           {"role": "user", "content": [{"type": "text", "text": "a"},
                                                        {"type": "text", "text": "b"}]}]})
    assert n.format == "openai-request"
    assert n.tools == (WEATHER,)
    assert n.messages == (Message(role="system", content="dev"),
                          Message(role="user", content="a\nb"))


def test_legacy_functions_and_function_call() -> None:
    n = norm({"functions": [STOCK_FN], "messages": [
        {"role": "user", "content": "MSFT?"},
        {"role": "assistant", "content": None,
         "function_call": {"name": "get_stock_price", "arguments": '{"symbol":"MSFT"}'}},
        {"role": "function", "name": "get_stock_price", "content": "400"},
        {"role": "user", "content": "and AAPL?"}]})
    assert n.tools == ({"type": "function", "function": STOCK_FN},)
    assert n.messages[1] == Message(role="assistant", tool_calls=(ToolCall(
        id="call_0",
        function=FunctionCall(name="get_stock_price", arguments='{"symbol":"MSFT"}')),))
    assert n.messages[2] == Message(role="tool", content="400", tool_call_id="call_0",
                                    name="get_stock_price")


HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. Here are the available tools: <tools> [{'type': 'function', "
    "'function': {'name': 'get_stock_price', 'description': 'Price of a stock.', 'parameters': "
    "{'type': 'object', 'properties': {'symbol': {'type': 'string'}}}}}] </tools> "
    "Use the pydantic model json schema for each tool call.")
HERMES = {"conversations": [
    {"from": "system", "value": HERMES_SYSTEM},
    {"from": "human", "value": "Price of AAPL?"},
    {"from": "gpt",
     "value": "<tool_call>\n{'arguments': {'symbol': 'AAPL'}, 'name': 'get_stock_price'}\n"
              "</tool_call>"},
    {"from": "tool", "value": "<tool_response>\n{\"price\": 150}\n</tool_response>"},
    {"from": "gpt", "value": "AAPL is at 150."},
    {"from": "human", "value": "And MSFT?"},
]}


def test_hermes_structured_lifts_tools_calls_and_responses() -> None:
    n = norm(HERMES)
    assert n.format == "hermes"
    assert n.tools == ({"type": "function", "function": STOCK_FN},)
    assert not n.tool_text
    assert n.messages == (
        Message(role="system", content=(
            "You are a function calling AI model. You are provided with function signatures "
            "within <tools></tools> XML tags. Here are the available tools:\n\n"
            "Use the pydantic model json schema for each tool call.")),
        Message(role="user", content="Price of AAPL?"),
        Message(role="assistant", tool_calls=(ToolCall(
            id="call_0",
            function=FunctionCall(name="get_stock_price", arguments='{"symbol": "AAPL"}')),)),
        Message(role="tool", content='{"price": 150}', tool_call_id="call_0"),
        Message(role="assistant", content="AAPL is at 150."),
        Message(role="user", content="And MSFT?"),
    )


def test_hermes_as_given_leaves_every_text_untouched() -> None:
    n = norm(HERMES, "as-given")
    assert n.format == "hermes"
    assert n.tools is None
    assert n.tool_text
    assert [m.content for m in n.messages] == [t["value"] for t in HERMES["conversations"]]
    assert [m.role for m in n.messages] == [
        "system", "user", "assistant", "tool", "assistant", "user"]


def test_available_tools_json_structured_and_as_given() -> None:
    system = ("You are a helpful assistant.\nAvailable tools:\n" + json.dumps([STOCK_FN])
              + "\nCall a tool when it helps.")
    record = {"messages": [{"role": "system", "content": system},
                           {"role": "user", "content": "AAPL?"}]}
    n = norm(record)
    assert n.format == "available-tools"
    assert n.tools == ({"type": "function", "function": STOCK_FN},)
    assert n.messages[0] == Message(role="system", content=(
        "You are a helpful assistant.\n\nCall a tool when it helps."))
    given = norm(record, "as-given")
    assert given.tools is None and given.tool_text
    assert given.messages[0].content == system


def test_unparseable_tool_block_is_kept_as_text_never_dropped() -> None:
    system = "Tools: <tools> this is not json </tools>"
    n = norm({"messages": [{"role": "system", "content": system},
                           {"role": "user", "content": "x"}]})
    assert n.tools is None and n.tool_text
    assert n.messages[0].content == system


def test_structured_tools_merge_with_system_tools_by_name() -> None:
    system = f"<tools>{json.dumps([WEATHER, {'type': 'function', 'function': STOCK_FN}])}</tools>"
    n = norm({"tools": [WEATHER], "messages": [{"role": "system", "content": system},
                                                {"role": "user", "content": "x"}]})
    assert n.tools == (WEATHER, {"type": "function", "function": STOCK_FN})
    assert n.messages == (Message(role="user", content="x"),)  # nothing else was in that prompt


def test_alpaca_with_and_without_input() -> None:
    assert norm({"instruction": "Sum", "input": "1 2", "output": "3"}).messages == (
        Message(role="user", content="Sum\n\n1 2"),)
    n = norm({"instruction": "Say hi", "input": "", "system": "Be kind."})
    assert n.format == "alpaca"
    assert n.messages == (Message(role="system", content="Be kind."),
                          Message(role="user", content="Say hi"))


def test_plain_prompt() -> None:
    n = norm({"prompt": "Why is the sky blue?", "id": 7})
    assert n.format == "prompt"
    assert n.messages == (Message(role="user", content="Why is the sky blue?"),)


@pytest.mark.parametrize(("record", "reason"), [
    (b'{"conversations": [{"from": "human", "value": "hi"}', "invalid-json"),
    (b'{"prompt": "caf\xe9"}', "invalid-utf8"),
    (b'{"prompt": "a\x00b"}', "nul-character"),
    (b'{"prompt": "a\\u0000b"}', "nul-character"),
    (b'{"prompt": 42}', "wrong-type"),
    (b'{"conversations": [{"from": "human", "value": ["x"]}]}', "wrong-type"),
    (b'{"messages": "hello"}', "wrong-type"),
    (b'["a", "b"]', "wrong-type"),
    (b'{"conversations": []}', "empty-conversation"),
    (b'{"conversations": [{"from": "wizard", "value": "x"}]}', "unknown-role"),
    (b'{"messages": [{"content": "no role"}]}', "unknown-role"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
     "unsupported-content"),
    (b'{"text": "what format is this"}', "unrecognized-format"),
    (b'{"tools": [{"nope": 1}], "messages": [{"role": "user", "content": "x"}]}', "invalid-tools"),
])
def test_bad_records_are_rejected_with_a_reason(record: bytes, reason: str) -> None:
    assert rejected(record).reason == reason


def test_wrong_type_names_the_field() -> None:
    assert "$.conversations[1].value" in rejected(
        b'{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": 3}]}').detail


def test_parquet_rows_convert_like_json() -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": None}]}
    assert normalize(decode(row), "structured").messages[0] == Message(role="user", content="hi")
    assert msgspec.json.encode(normalize(decode(row), "structured").messages[0]) == \
        b'{"role":"user","content":"hi"}'
