"""Multi-turn policies: the exact context each keeps, and prompt categories."""

from __future__ import annotations

import pytest

from producer.multiturn import apply_policy, category
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


def test_last_user_keeps_everything_up_to_the_last_user_turn() -> None:
    assert apply_policy(CONVERSATION, "last-user") == [
        ((SYS, U1, CALL, RESULT, A1, U2, A2, U3), None)]


def test_last_user_regenerates_a_final_turn_with_tool_calls() -> None:
    """The final assistant turn, its calls and their results are what the model makes."""
    assert apply_policy((SYS, U1, CALL, RESULT, A1), "last-user") == [((SYS, U1), None)]


def test_strip_assistant_keeps_system_and_user_turns_only() -> None:
    assert apply_policy(CONVERSATION, "strip-assistant") == [((SYS, U1, U2, U3), None)]


def test_per_user_turn_yields_one_prompt_per_user_turn_with_its_context() -> None:
    assert apply_policy(CONVERSATION, "per-user-turn") == [
        ((SYS, U1), 0),
        ((SYS, U1, CALL, RESULT, A1, U2), 1),
        ((SYS, U1, CALL, RESULT, A1, U2, A2, U3), 2),
    ]


@pytest.mark.parametrize("policy", ["last-user", "strip-assistant", "per-user-turn"])
def test_nothing_to_generate_is_rejected(policy: str) -> None:
    with pytest.raises(Reject) as info:
        apply_policy((SYS, A1), policy)  # type: ignore[arg-type]
    assert info.value.reason == "no-user-turn"


def test_an_empty_last_user_turn_is_rejected() -> None:
    with pytest.raises(Reject) as info:
        apply_policy((U1, A1, Message(role="user", content="  ")), "last-user")
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
    assert category(messages, tools, tool_text) == expected
