"""The sink's side of regenerate-turns: one record per conversation, routed
by its first bad step, stored as one self-contained line."""

from __future__ import annotations

import msgspec

from schemas import Conversation, Failure, Message, PromptRecord, RunSpec, Step
from schemas.completion import encode_record
from schemas.sample import ConversationSample
from sink import samples
from sink.routing import dlq_reason

SPEC = RunSpec(run_id="r", partitions=1, multi_turn="regenerate-turns")
PROMPT = PromptRecord(id="c", run="r", source="s", format="openai", category="multi-turn",
                      messages=(Message(role="system", content="sys"),
                                Message(role="user", content="u0"),
                                Message(role="assistant", content="dataset"),
                                Message(role="user", content="u1")))


def step(turn: int, content: str = "a fine answer", finish: str = "stop") -> Step:
    return Step(turn=turn, finish_reason=finish, content=content, reasoning_content="think")


def conversation(*steps: Step) -> Conversation:
    return Conversation(id="c", run="r", settings_hash=SPEC.settings_hash, prompt=PROMPT,
                        steps=steps)


def test_a_good_conversation_is_one_line_with_the_models_own_turns() -> None:
    record = conversation(step(0, "first"), step(1, "second"))
    assert dlq_reason(record, SPEC) is None
    view = samples.decode_view(encode_record(record))
    assert view == record
    line = msgspec.json.decode(samples.encode_line(samples.conversation_sample(view)),
                               type=ConversationSample)
    assert [(m.role, m.content) for m in line.messages] == [
        ("system", "sys"), ("user", "u0"), ("assistant", "first"), ("user", "u1"),
        ("assistant", "second")]
    assert line.steps == record.steps and line.outcome == "finished"


def test_the_first_bad_step_dead_letters_the_conversation() -> None:
    record = conversation(step(0), step(1, "cut", finish="length"))
    reason, detail = dlq_reason(record, SPEC)
    assert reason == "length" and detail.startswith("step 1 (user turn 1): ")


def test_a_failed_conversation_names_its_step_and_reason() -> None:
    failure = Failure(id="c", run="r", settings_hash=SPEC.settings_hash, prompt=PROMPT,
                      failure="invalid_tool_call", error="tool call 'x': not offered", step=1,
                      steps=(step(0),))
    assert dlq_reason(failure, SPEC) == ("invalid_tool_call",
                                         "step 1: tool call 'x': not offered")
    timeout = msgspec.structs.replace(failure, failure="timeout", error="slow")
    assert dlq_reason(timeout, SPEC)[0] == "failed"
    assert dlq_reason(timeout, SPEC)[1].startswith("step 1: timeout")
