"""Every record read from the prompts topic is untrusted (pure).

A record is a prompt of this run only if it has a value, decodes as a
`PromptRecord`, belongs to the run that owns the topic (a replay reads its
parent's topic, whose prompts carry the parent's id) and has something to
send. Anything else becomes a failure of kind `invalid` that keeps the record
as read; the sink dead-letters it with reason `invalid`, and its offset is
committed like any other, so one poison record never stops a run.
"""

from __future__ import annotations

import msgspec

from schemas import Failure, PromptRecord, RunSpec
from schemas.raw import capture

_decoder = msgspec.json.Decoder(PromptRecord)


def topic_run(topic: str) -> str:
    """`tokenmill.<run>.prompts` -> `<run>` (run ids never hold a dot)."""
    return topic.split(".")[1] if topic.count(".") >= 2 else topic


def check_prompt(value: bytes | None, owner: str) -> PromptRecord | str:
    """The prompt, or what is wrong with the record."""
    if value is None:
        return "null value (a tombstone) in the prompts topic"
    try:
        prompt = _decoder.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"not a prompt record: {exc}"
    if prompt.run != owner:
        return f"a prompt of run {prompt.run!r} in the prompts topic of run {owner!r}"
    if not prompt.messages:
        return "a prompt with no messages"
    return prompt


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
