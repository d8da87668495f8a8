"""regenerate-turns: the pure pieces (transcript, next move, tool-call checks
and matching, turn-record validation, counters), directly and as properties."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumer import counters
from consumer.tool_calls import calls_problem, dataset_answer, recorded_results
from consumer.turns import MAX_TOOL_ROUNDS, Position, advance, dataset_answerer, position_of
from consumer.validation import check_turn
from schemas import (
    Completion,
    Conversation,
    Failure,
    FunctionCall,
    Message,
    PromptRecord,
    RunSpec,
    ToolCall,
)
from schemas.progress import ConsumerProgress
from schemas.turn import TurnRecord
from tests.e2e.tool_hooks import answer as hook
from tokenmill.conversation import final_transcript, transcript
from tokenmill.tool_results import HookUnavailable, load_hook

SPEC = RunSpec(run_id="r", partitions=1, multi_turn="regenerate-turns")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def conversation(users: int, *, system: bool = True, tools: bool = False,
                 recorded: dict[str, str] | None = None) -> PromptRecord:
    messages: list[Message] = [Message(role="system", content="Be brief.")] if system else []
    for i in range(users):
        messages.append(Message(role="user", content=f"question {i}"))
        if i == 0 and recorded:
            calls = tuple(ToolCall(FunctionCall("get_weather", json.dumps({"city": city})),
                                   id=f"c{n}") for n, city in enumerate(recorded))
            messages.append(Message(role="assistant", tool_calls=calls))
            messages += [Message(role="tool", content=result, tool_call_id=f"c{n}")
                         for n, result in enumerate(recorded.values())]
        messages.append(Message(role="assistant", content=f"dataset answer {i}"))
    return PromptRecord(id="conv", run="r", messages=tuple(messages), source="s.jsonl",
                        format="openai", category="multi-turn",
                        tools=(WEATHER,) if tools else None)


def answer(request: PromptRecord, text: str, *, calls: tuple[ToolCall, ...] | None = None,
           finish: str = "stop") -> Completion:
    return Completion(id=request.id, run="r", settings_hash=SPEC.settings_hash, prompt=request,
                      finish_reason="tool_calls" if calls else finish, content=text,
                      reasoning_content="thinking", tool_calls=calls)


def call(name: str = "get_weather", arguments: str = '{"city": "Paris"}') -> ToolCall:
    return ToolCall(FunctionCall(name, arguments), id="x1")


def no_answer(_: ToolCall) -> str | None:
    return None


def test_each_request_carries_the_models_own_earlier_answers() -> None:
    prompt = conversation(3)
    at = position_of(prompt)
    requests = []
    while True:
        request = at.request()
        requests.append(request)
        nxt = advance(at, answer(request, f"model answer {at.step}"), no_answer)
        if not isinstance(nxt, TurnRecord):
            break
        at = position_of(nxt)
    assert isinstance(nxt, Conversation) and nxt.outcome == "finished"
    assert [m.content for m in requests[2].messages] == [
        "Be brief.", "question 0", "model answer 0", "question 1", "model answer 1",
        "question 2"]
    assert all("dataset answer" not in (m.content or "") for r in requests for m in r.messages)
    assert len({r.id for r in requests}) == 3  # one rid per step
    assert [m.content for m in final_transcript(prompt.messages, nxt.steps)][-1] == \
        "model answer 2"


def test_a_length_answer_ends_the_conversation_for_the_sink_to_judge() -> None:
    at = position_of(conversation(3))
    nxt = advance(at, answer(at.request(), "cut", finish="length"), no_answer)
    assert isinstance(nxt, Conversation) and len(nxt.steps) == 1


def test_a_failed_step_dead_letters_the_conversation_at_that_step() -> None:
    prompt = conversation(2)
    first = advance(position_of(prompt), answer(position_of(prompt).request(), "a0"), no_answer)
    assert isinstance(first, TurnRecord)
    at = position_of(first)
    failure = Failure(id=at.request().id, run="r", settings_hash="h", prompt=at.request(),
                      failure="server_error", error="boom")
    out = advance(at, failure, no_answer)
    assert isinstance(out, Failure) and out.id == "conv" and out.step == 1
    assert out.prompt == prompt and len(out.steps) == 1


def test_a_recorded_tool_result_is_spliced_in_and_the_turn_goes_on() -> None:
    prompt = conversation(2, tools=True, recorded={"Paris": "sunny"})
    at = position_of(prompt)
    # Same call, arguments spelled differently: still the same call.
    nxt = advance(at, answer(at.request(), "", calls=(call(arguments='{ "city":"Paris" }'),)),
                  dataset_answerer(prompt))
    assert isinstance(nxt, TurnRecord) and nxt.next_turn == 0
    assert [(m.role, m.content) for m in nxt.steps[0].tool_results] == [("tool", "sunny")]
    request = position_of(nxt).request()
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool"]


def test_a_call_the_dataset_cannot_answer_ends_as_tool_unresolved() -> None:
    prompt = conversation(2, tools=True, recorded={"Paris": "sunny"})
    at = position_of(prompt)
    nxt = advance(at, answer(at.request(), "", calls=(call(arguments='{"city": "Rome"}'),)),
                  dataset_answerer(prompt))
    assert isinstance(nxt, Conversation) and nxt.outcome == "tool_unresolved"


def test_the_hook_answers_first_and_its_errors_dead_letter() -> None:
    prompt = conversation(1, tools=True, recorded={"Paris": "sunny"})
    at = position_of(prompt)
    nxt = advance(at, answer(at.request(), "", calls=(call(),)),
                  dataset_answerer(prompt, lambda c, p: "from the hook"))
    assert isinstance(nxt, TurnRecord) and nxt.steps[0].tool_results[0].content == "from the hook"

    def broken(c: ToolCall, p: PromptRecord) -> str | None:
        raise KeyError("nope")
    out = advance(at, answer(at.request(), "", calls=(call(),)), dataset_answerer(prompt, broken))
    assert isinstance(out, Failure) and out.failure == "tool_hook_error"


def test_invalid_tool_calls_are_dead_lettered() -> None:
    prompt = conversation(1, tools=True, recorded={"Paris": "sunny"})
    at = position_of(prompt)
    for bad in (call(arguments='{"city": "Par'), call(name="get_time"),
                call(arguments='{"town": "Paris"}'), call(arguments='{"city": 3}'),
                call(arguments='["Paris"]')):
        out = advance(at, answer(at.request(), "", calls=(bad,)), dataset_answerer(prompt))
        assert isinstance(out, Failure) and out.failure == "invalid_tool_call", bad
        assert out.step == 0 and out.steps[0].tool_calls == (bad,)


def test_tool_rounds_are_capped_per_user_turn() -> None:
    prompt = conversation(1, tools=True, recorded={"Paris": "sunny"})
    at = position_of(prompt)
    for _ in range(MAX_TOOL_ROUNDS):
        nxt = advance(at, answer(at.request(), "", calls=(call(),)), dataset_answerer(prompt))
        assert isinstance(nxt, TurnRecord)
        at = position_of(nxt)
    out = advance(at, answer(at.request(), "", calls=(call(),)), dataset_answerer(prompt))
    assert isinstance(out, Conversation) and out.outcome == "tool_limit"


def test_calls_problem_and_matching_directly() -> None:
    assert calls_problem((call(),), (WEATHER,)) is None
    assert "not one of the offered tools" in calls_problem((call(),), None)
    recorded = recorded_results(conversation(1, recorded={"Paris": "sunny", "Oslo": "snow"}
                                             ).messages)
    assert dataset_answer(call(arguments='{"city": "Oslo"}'), recorded) == "snow"
    assert dataset_answer(call(arguments="not json"), recorded) is None


def test_turn_records_are_validated() -> None:
    prompt = conversation(2)
    good = advance(position_of(prompt), answer(position_of(prompt).request(), "a"), no_answer)
    assert isinstance(check_turn(msgspec.json.encode(good), SPEC), TurnRecord)
    assert isinstance(check_turn(None, SPEC), str)
    assert isinstance(check_turn(b"{", SPEC), str)
    assert isinstance(check_turn(msgspec.json.encode(msgspec.structs.replace(good, run="x")),
                                 SPEC), str)
    assert isinstance(check_turn(msgspec.json.encode(msgspec.structs.replace(good, next_turn=2)),
                                 SPEC), str)
    assert isinstance(check_turn(msgspec.json.encode(msgspec.structs.replace(good, steps=())),
                                 SPEC), str)


@given(users=st.integers(1, 6), system=st.booleans(),
       lengths=st.lists(st.sampled_from(["stop", "length"]), min_size=6, max_size=6))
def test_property_turns_are_answered_once_in_order(users: int, system: bool,
                                                  lengths: list[str]) -> None:
    """Whatever the answers, turn k's request holds u0..uk and exactly the
    answers generated before it; the conversation ends once, and the
    counters count every step and leave nothing pending."""
    prompt = conversation(users, system=system)
    at = position_of(prompt)
    committed: list[TurnRecord | Conversation | Failure] = []
    while True:
        request = at.request()
        assert request.messages == transcript(prompt.messages, at.steps, at.turn)
        user_texts = [m.content for m in request.messages if m.role == "user"]
        assert user_texts == [f"question {i}" for i in range(at.turn + 1)]
        assert [m.content for m in request.messages if m.role == "assistant"] == \
            [s.content for s in at.steps]
        nxt = advance(at, answer(request, f"a{at.step}", finish=lengths[at.step]), no_answer)
        committed.append(nxt)
        if not isinstance(nxt, TurnRecord):
            break
        at = position_of(nxt)
    assert isinstance(nxt, Conversation)
    assert [s.turn for s in nxt.steps] == list(range(len(nxt.steps)))
    expected = users if "length" not in lengths[:users] else lengths.index("length") + 1
    assert len(nxt.steps) == expected
    progress = counters.add_records(ConsumerProgress(run="r", instance="w"), committed)
    assert (progress.turns, progress.turns_pending, progress.completions) == (expected, 0, 1)


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.integers() | st.text(max_size=5),
                       max_size=4))
def test_property_matching_ignores_key_order_and_spacing(arguments: dict) -> None:
    recorded = [("f", arguments, "result")]
    reordered = json.dumps(dict(reversed(list(arguments.items()))), indent=2)
    assert dataset_answer(call("f", reordered), recorded) == "result"
    assert dataset_answer(call("g", reordered), recorded) is None


def test_position_of_a_prompt_starts_at_turn_zero() -> None:
    assert position_of(conversation(2)) == Position(conversation(2))


def test_the_tool_results_hook_is_loaded_by_name() -> None:
    assert load_hook("tests.e2e.tool_hooks:answer") is hook
    for bad in ("tests.e2e.tool_hooks", "no_such_module:f", "tests.e2e.tool_hooks:missing"):
        with pytest.raises(HookUnavailable):
            load_hook(bad)
