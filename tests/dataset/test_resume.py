"""A dead-lettered conversation redriven `--from-failed-turn` (pure pieces):
where it resumes, what the redrive publishes, what the worker sends and
commits for it, and how the counters see it. No finished turn is generated
twice: the first request of the resumed conversation is the failed step's."""

from __future__ import annotations

from pathlib import Path

import msgspec

from consumer import counters
from consumer.turns import advance, position_of
from consumer.validation import check_prompt
from ops.redrive import spool_dead_letters
from ops.resume import failed_step, next_turn, resumed_prompt
from producer.spool import SpoolReader, SpoolWriter, bucket_path
from schemas import Conversation, DeadLetter, Failure, Message, PromptRecord, RunSpec, Step
from schemas.progress import ConsumerProgress
from schemas.prompt import Resume
from schemas.turn import TurnRecord
from tests.consumer.test_turns import answer, call, conversation, no_answer
from tokenmill.conversation import transcript

SPEC = RunSpec(run_id="p", partitions=1, multi_turn="regenerate-turns")


def done(turn: int, text: str, finish: str = "stop", *, tools: bool = False) -> Step:
    results = (Message("tool", "sunny", tool_call_id="x1"),) if tools else ()
    return Step(turn=turn, finish_reason="tool_calls" if tools else finish,
                content=text, reasoning_content="thinking",
                tool_calls=(call(),) if tools else None, tool_results=results)


PROMPT = msgspec.structs.replace(conversation(3, tools=True), id="c0" * 16)
# Turn 0 (a tool round, then an answer), turn 1 answered, turn 2 cut at length.
STEPS = (done(0, "", tools=True), done(0, "answer 0"), done(1, "answer 1"),
         done(2, "cut", "length"))


def cut_conversation() -> Conversation:
    return Conversation(id=PROMPT.id, run="p", settings_hash=SPEC.settings_hash, prompt=PROMPT,
                        steps=STEPS)


def failure_at(step: int) -> Failure:
    return Failure(id=PROMPT.id, run="p", settings_hash=SPEC.settings_hash, prompt=PROMPT,
                   failure="timeout", error="timed out", step=step, steps=STEPS[:step])


def test_a_conversation_resumes_at_the_step_that_was_dead_lettered() -> None:
    assert failed_step(cut_conversation(), SPEC) == 3
    assert failed_step(failure_at(2), SPEC) == 2
    assert failed_step(failure_at(0), SPEC) == 0
    # The first step the policy lists decides: a trivial answer earlier wins.
    trivial = msgspec.structs.replace(cut_conversation(), steps=(
        STEPS[0], done(0, "ok"), *STEPS[2:]))
    assert failed_step(trivial, SPEC) == 1
    assert next_turn(STEPS[:1]) == 0 and next_turn(STEPS[:2]) == 1 and next_turn(STEPS[:3]) == 2


def test_the_redriven_prompt_carries_the_steps_before_it() -> None:
    prompt = resumed_prompt(cut_conversation(), SPEC)
    assert isinstance(prompt.resume, Resume)
    assert prompt.resume.next_turn == 2
    assert prompt.resume.steps == tuple(msgspec.structs.replace(s, carried=True)
                                        for s in STEPS[:3])
    # Failed at its first step: published as the dataset conversation.
    assert resumed_prompt(failure_at(0), SPEC) == PROMPT
    # The record a redrive publishes: decodes as a prompt of the child run.
    encoded = msgspec.json.encode(msgspec.structs.replace(prompt, run="child"))
    assert isinstance(check_prompt(encoded, "child"), PromptRecord)
    broken = msgspec.structs.replace(prompt, run="child", resume=Resume(
        steps=prompt.resume.steps, next_turn=7))
    problem = check_prompt(msgspec.json.encode(broken), "child")
    assert isinstance(problem, str) and "resumed conversation" in problem


def test_the_worker_goes_on_from_the_failed_step_and_keeps_every_step() -> None:
    prompt = msgspec.structs.replace(resumed_prompt(cut_conversation(), SPEC), run="c")
    at = position_of(prompt)
    assert at.prompt == msgspec.structs.replace(PROMPT, run="c")  # resume not carried on
    request = at.request()
    assert request.id == f"{PROMPT.id}-s3"  # the failed step's request, not an earlier one
    assert request.messages == transcript(PROMPT.messages, at.steps, 2)
    result = advance(at, answer(request, "answer 2"), no_answer)
    assert isinstance(result, Conversation)
    assert [s.content for s in result.steps] == ["", "answer 0", "answer 1", "answer 2"]
    assert [s.carried for s in result.steps] == [True, True, True, False]
    # Counters: one turn generated here, no turn record left pending.
    progress = counters.add_records(ConsumerProgress(run="c", instance="w"), [result])
    assert progress.turns == 1 and progress.turns_pending == 0


def test_counters_of_a_resumed_conversation_with_turns_left() -> None:
    carried = tuple(msgspec.structs.replace(s, carried=True) for s in STEPS[:2])
    prompt = msgspec.structs.replace(PROMPT, run="c", resume=Resume(carried, 1))
    at = position_of(prompt)
    middle = advance(at, answer(at.request(), "answer 1"), no_answer)
    assert isinstance(middle, TurnRecord) and middle.next_turn == 2
    at2 = position_of(middle)
    last = advance(at2, answer(at2.request(), "answer 2"), no_answer)
    progress = counters.add_records(ConsumerProgress(run="c", instance="w"), [middle])
    assert progress.turns_pending == 1
    progress = counters.add_records(progress, [last])
    assert progress.turns == 2 and progress.turns_pending == 0
    # A failure at the resumed step had no turn record of this run out.
    failed = Failure(id=PROMPT.id, run="c", settings_hash="h", prompt=PROMPT, failure="timeout",
                     error="x", step=2, steps=carried)
    progress = counters.add_records(ConsumerProgress(run="c", instance="w"), [failed])
    assert progress.turns_pending == 0


def test_spooling_from_the_failed_turn(tmp_path: Path) -> None:
    letters = [DeadLetter(id=PROMPT.id, run="p", reason="length", detail="", source_topic="t",
                          source_partition=0, source_offset=0, record=cut_conversation())]
    spool = SpoolWriter(tmp_path / "spool")
    spooled = spool_dead_letters([("length", msgspec.json.encode(dl)) for dl in letters],
                                 ("length",), "child", spool, SPEC)
    spool.close()
    assert spooled.total == 1 and spooled.resumed == 1
    line = SpoolReader(bucket_path(tmp_path / "spool", 0)).next()
    record = msgspec.json.decode(line[len(PROMPT.id):-1] + b',"seq":0,"v":1}', type=PromptRecord)
    assert record.run == "child" and isinstance(record.resume, Resume)
    assert len(record.resume.steps) == 3
