"""Multi-turn policies: the exact context each keeps, and prompt categories."""

from __future__ import annotations

import pytest

from producer.formats import from_messages
from producer.multiturn import Prompt, apply_policy, category_of
from producer.rejects import Reject
from schemas.messages import FunctionCall, Message, ToolCall

SYS = Message(role="system", content="sys")
U1 = Message(role="user", content="weather in Oslo?")
CALL = Message(role="assistant", tool_calls=(ToolCall(
    id="c0", function=FunctionCall(name="get_weather", arguments='{"city":"Oslo"}')),))
RESULT = Message(role="tool", content="-3C", tool_call_id="c0")
A1 = Message(role="assistant", content="It is -3C.")
U2 = Message(role="user", content="and tomorrow?")
A2 = Message(role="assistant", content="Snow.")
U3 = Message(role="user", content="thanks")
A3 = Message(role="assistant", content="Welcome.")
CONVERSATION = (SYS, U1, CALL, RESULT, A1, U2, A2, U3, A3)


def policy(messages: tuple[Message, ...], name: str, tools=None) -> list[Prompt]:
    return apply_policy(from_messages(messages, tools), name)  # type: ignore[arg-type]


def test_last_user_keeps_everything_up_to_the_last_user_turn() -> None:
    assert policy(CONVERSATION, "last-user") == [
        Prompt((SYS, U1, CALL, RESULT, A1, U2, A2, U3), None, "tools", 3)]


def test_last_user_regenerates_a_final_turn_with_tool_calls() -> None:
    """The final assistant turn, its calls and their results are what the model makes."""
    assert policy((SYS, U1, CALL, RESULT, A1), "last-user") == [
        Prompt((SYS, U1), None, "system-prompt", 1)]


def test_strip_assistant_keeps_system_and_user_turns_only() -> None:
    assert policy(CONVERSATION, "strip-assistant") == [
        Prompt((SYS, U1, U2, U3), None, "multi-turn", 3)]


def test_per_user_turn_yields_one_prompt_per_user_turn_with_its_context() -> None:
    assert policy(CONVERSATION, "per-user-turn") == [
        Prompt((SYS, U1), 0, "system-prompt", 1),
        Prompt((SYS, U1, CALL, RESULT, A1, U2), 1, "tools", 2),
        Prompt((SYS, U1, CALL, RESULT, A1, U2, A2, U3), 2, "tools", 3),
    ]


def test_tool_specs_make_every_prompt_a_tools_prompt() -> None:
    tool = {"type": "function", "function": {"name": "get_weather"}}
    assert [p.category for p in policy(CONVERSATION, "per-user-turn", (tool,))] == ["tools"] * 3
    assert policy(CONVERSATION, "strip-assistant", (tool,))[0].category == "tools"


@pytest.mark.parametrize("name", ["last-user", "strip-assistant", "per-user-turn"])
def test_nothing_to_generate_is_rejected(name: str) -> None:
    with pytest.raises(Reject) as info:
        policy((SYS, A1), name)
    assert info.value.reason == "no-user-turn"


def test_an_empty_last_user_turn_is_rejected() -> None:
    with pytest.raises(Reject) as info:
        policy((U1, A1, Message(role="user", content="  ")), "last-user")
    assert info.value.reason == "empty-prompt"


TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(("messages", "tools", "tool_text", "expected"), [
    ((U1,), None, False, "plain"),
    ((SYS, U1), None, False, "system-prompt"),
    ((SYS, U1, A1, U2), None, False, "multi-turn"),
    ((U1,), (TOOL,), False, "tools"),
    ((SYS, U1), None, True, "tools"),  # tools left in the system prompt as text
    ((U1, CALL, RESULT, A1, U2), None, False, "tools"),  # tool calls in the context
    ((SYS, U1, A1, U2), (TOOL,), False, "tools"),  # tools outrank multi-turn
])
def test_category(messages, tools, tool_text, expected) -> None:
    assert category_of(messages, tools, tool_text) == expected
    prompts = apply_policy(from_messages(messages, tools, tool_text), "last-user")
    assert prompts[0].category == expected


def test_regenerate_turns_keeps_the_whole_conversation_as_one_prompt() -> None:
    """The workers feed its user turns in one at a time; the dataset's tool
    results stay for them to splice in."""
    assert policy(CONVERSATION, "regenerate-turns") == [
        Prompt(CONVERSATION, None, "tools", 3)]
    assert policy((U1, A1, U2, A2), "regenerate-turns") == [
        Prompt((U1, A1, U2, A2), None, "multi-turn", 2)]


def test_regenerate_turns_rejects_any_empty_user_turn() -> None:
    with pytest.raises(Reject, match="user turn 1 is empty"):
        policy((U1, A1, Message(role="user", content=" "), A2), "regenerate-turns")
