"""Every record read from the prompts topic is untrusted (pure).

A record is a prompt of this run only if it has a value, decodes as a
`PromptRecord`, belongs to the run that owns the topic (a replay reads its
parent's topic, whose prompts carry the parent's id) and has something to
send. Anything else becomes a failure of kind `invalid` that keeps the record
as read; the sink dead-letters it with reason `invalid`, and its offset is
committed like any other, so one poison record never stops a run.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from schemas import Failure, Message, PromptRecord, RunSpec, Step
from schemas.prompt import Resume
from schemas.raw import capture
from schemas.turn import TurnRecord
from tokenmill.conversation import user_turns

_decoder = msgspec.json.Decoder(PromptRecord)
T = TypeVar("T")


def topic_run(topic: str) -> str:
    """`tokenmill.<run>.prompts` -> `<run>` (run ids never hold a dot)."""
    return topic.split(".")[1] if topic.count(".") >= 2 else topic


def decoded(decoder: msgspec.json.Decoder[T], value: bytes | None, what: str) -> T | str:
    """The record, or why it is not one (`what`: "prompt", "turn")."""
    if value is None:
        return f"null value (a tombstone) in the {what}s topic"
    try:
        return decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"not a {what} record: {exc}"


def check_prompt(value: bytes | None, owner: str) -> PromptRecord | str:
    """The prompt, or what is wrong with the record."""
    prompt = decoded(_decoder, value, "prompt")
    if isinstance(prompt, str):
        return prompt
    if prompt.run != owner:
        return f"a prompt of run {prompt.run!r} in the prompts topic of run {owner!r}"
    if not prompt.messages:
        return "a prompt with no messages"
    if isinstance(prompt.resume, Resume):
        problem = steps_problem(prompt.messages, prompt.resume.steps, prompt.resume.next_turn)
        if problem is not None:
            return "a resumed conversation: " + problem
    return prompt


def steps_problem(dataset: tuple[Message, ...], steps: tuple[Step, ...],
                  next_turn: int) -> str | None:
    """What is wrong with a conversation's steps before user turn
    `next_turn` (they answer turns 0, 1, ... in order, none past it), if anything."""
    users = user_turns(dataset)
    turns = [s.turn for s in steps]
    if not steps or not 0 <= next_turn < users:
        return f"no steps, or next turn {next_turn} of {users}"
    if turns != sorted(turns) or turns[0] != 0 or turns[-1] > next_turn or \
            any(b - a > 1 for a, b in zip(turns, turns[1:])) or next_turn - turns[-1] > 1:
        return f"steps answer turns {turns} before turn {next_turn}"
    return None


def invalid_record(spec: RunSpec, *, topic: str, partition: int, offset: int,
                   key: bytes | None, value: bytes | None, problem: str,
                   instance: str) -> Failure:
    """The failure record that carries an invalid prompts-topic record to the
    dead-letter topic. Its id names the position, so it never collides with
    a prompt's id (a foreign prompt may reuse one)."""
    record_id = f"invalid:{topic}:{partition}:{offset}"
    placeholder = PromptRecord(id=record_id, run=spec.run_id, messages=(), source="?",
                               format="?", category="plain")
    return Failure(id=record_id, run=spec.run_id, settings_hash=spec.settings_hash,
                   prompt=placeholder, failure="invalid", error=problem[:2000],
                   instance=instance, raw=capture(topic, partition, offset, key, value))


_turn_decoder = msgspec.json.Decoder(TurnRecord)


def check_turn(value: bytes | None, spec: RunSpec) -> TurnRecord | str:
    """A conversation between two turns of this run, or what is wrong with it."""
    record = decoded(_turn_decoder, value, "turn")
    if isinstance(record, str):
        return record
    if record.run != spec.run_id:
        return f"a turn record of run {record.run!r} in the turns topic of run {spec.run_id!r}"
    if record.settings_hash != spec.settings_hash:
        return (f"a turn record made with settings {record.settings_hash}, the run's are "
                f"{spec.settings_hash}")
    problem = steps_problem(record.prompt.messages, record.steps, record.next_turn)
    if problem is not None:
        return f"a turn record with {problem}"
    return record
