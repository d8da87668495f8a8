import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import (
    Completion,
    Failure,
    GenerationSettings,
    Message,
    PromptRecord,
    QAPolicy,
    RunSpec,
    decode_completion,
    encode_record,
)
from schemas.generate import stale_files


def test_json_schema_files_are_current() -> None:
    assert stale_files() == [], "run `python -m schemas.generate` and commit the result"


def _prompt(text: str) -> PromptRecord:
    return PromptRecord(id="p1", run="r", messages=(Message(role="user", content=text),),
                        source="f.jsonl", format="plain", category="plain", line=1)


@given(st.text(), st.sampled_from(["stop", "length", "tool_calls"]))
def test_completion_round_trips(text: str, finish: str) -> None:
    record = Completion(id="p1", run="r", settings_hash="h", prompt=_prompt(text),
                        finish_reason=finish, content=text)
    assert decode_completion(encode_record(record)) == record


def test_records_carry_kind_version_and_id() -> None:
    failure = Failure(id="p1", run="r", settings_hash="h", prompt=_prompt("x"),
                      failure="prompt_too_long", error="too long", status=400)
    wire = msgspec.json.decode(encode_record(failure))
    assert wire["kind"] == "failure"
    assert wire["v"] == 1
    assert wire["id"] == "p1"
    assert isinstance(decode_completion(encode_record(failure)), Failure)


@given(st.integers(1, 100_000), st.floats(0, 2), st.booleans())
def test_settings_hash_separates_settings(max_tokens: int, temperature: float,
                                          thinking: bool) -> None:
    a = GenerationSettings(max_tokens=max_tokens, temperature=temperature, enable_thinking=thinking)
    b = GenerationSettings(max_tokens=max_tokens + 1, temperature=temperature,
                           enable_thinking=thinking)
    assert a.settings_hash() == GenerationSettings(
        max_tokens=max_tokens, temperature=temperature, enable_thinking=thinking
    ).settings_hash()
    assert a.settings_hash() != b.settings_hash()


def test_4096_and_8192_token_runs_differ() -> None:
    assert (RunSpec(run_id="a", partitions=1,
                    generation=GenerationSettings(max_tokens=4096)).settings_hash
            != RunSpec(run_id="a", partitions=1,
                       generation=GenerationSettings(max_tokens=8192)).settings_hash)


def test_qa_policy_is_canonical_and_validated() -> None:
    assert QAPolicy(dlq_reasons=("length", "failed")) == QAPolicy(dlq_reasons=("failed", "length"))
    with pytest.raises(ValueError, match="unknown DLQ reason"):
        QAPolicy(dlq_reasons=("lenght",))


@pytest.mark.parametrize("bad", ["", "has space", "dot.ted", "-lead", "x" * 101])
def test_run_id_is_checked(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid run id"):
        RunSpec(run_id=bad, partitions=1)


def test_unknown_spec_fields_are_refused() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"run_id":"a","partitions":1,"colour":"red"}', type=RunSpec)
