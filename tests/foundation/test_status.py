"""`tokenmill status` numbers, from committed progress records."""

import json

import jsonschema
import msgspec
import pytest
from rich.console import Console

from ops.status import STATUS_SCHEMA_PATH, summarize
from ops.status_report import schema, to_report
from ops.status_view import render
from schemas import Estimate, GenerationSettings, RunSpec
from schemas.progress import (
    ConsumerProgress,
    ProducerCheckpoint,
    ServerSnapshot,
    SinkProgress,
)
from tokenmill.progress import RunProgress

SPEC = RunSpec(run_id="r", partitions=4, generation=GenerationSettings(max_tokens=4096),
               estimate=Estimate(requests_per_s=10.0, output_tokens=2400))


def _state() -> RunProgress:
    state = RunProgress(run="r")
    state.producer = ProducerCheckpoint(run="r", next_seq=1000, total=1000, done=True,
                                        by_category={"plain": 800, "tools": 200},
                                        rejected=3, duplicates=5)
    state.consumers["gpu0"] = ConsumerProgress(
        run="r", instance="gpu0", completions=390, failures=10,
        failures_by_kind={"prompt_too_long": 10}, finish_reasons={"stop": 320, "length": 70},
        by_category={"plain": 300, "tools": 100}, completion_tokens=390 * 2000,
        spec_accept_weighted=3.0 * 1000, spec_tokens=1000, started_at=1000.0, updated_at=1100.0,
        concurrency_limit=64, in_flight=60)
    state.consumers["gpu1"] = ConsumerProgress(
        run="r", instance="gpu1", completions=100, finish_reasons={"stop": 100},
        by_category={"plain": 100}, completion_tokens=100 * 2000, started_at=1050.0,
        updated_at=1100.0)
    state.sinks["s0"] = SinkProgress(run="r", instance="s0", s3_records=300, dlq_records=80,
                                     dlq_by_reason={"length": 70, "failed": 10}, s3_objects=1)
    return state


def test_summary_answers_the_operators_questions() -> None:
    s = summarize(SPEC, _state(), now=1110.0)
    assert s["generated"] == 500 and s["published"] == 1000
    assert s["requests_per_s"] == 500 / 100  # over the span since the first worker started
    assert s["eta_s"] == 500 / 5.0
    assert s["finish_reasons"] == {"stop": 420, "length": 70}
    assert s["accept_length"] == 3.0
    assert s["generated_by_category"] == {"plain": 400, "tools": 100}
    assert s["planned_by_category"]["tools"] == 200
    assert s["persisted"] == 380 and s["dlq_by_reason"]["length"] == 70
    gpu0 = s["instances"][0]
    assert gpu0["instance"] == "gpu0" and gpu0["concurrency_limit"] == 64
    assert gpu0["tokens_per_s"] == 390 * 2000 / 100
    assert not s["sink_done"]


def test_report_renders_every_section() -> None:
    console = Console(record=True, width=160)
    console.print(render(SPEC, summarize(SPEC, _state(), now=1110.0)))
    text = console.export_text()
    for needle in ("published", "speed vs estimate", "finish length", "DLQ: length",
                   "speculative accept length", "coverage by category", "tools", "gpu0",
                   "sinks", "STALLED", "CRITICAL: run: stalled: no live sink"):
        assert needle in text


def test_json_output_follows_the_published_schema() -> None:
    """`status --json` is converted to StatusReport, and the committed
    ops/status.schema.json is the one generated from it, so a monitoring
    script can validate what it reads (here with an independent validator)."""
    committed = json.loads(STATUS_SCHEMA_PATH.read_text())
    assert committed == json.loads(msgspec.json.encode(schema())), (
        "regenerate: python -m ops.status_report > ops/status.schema.json")
    state = _state()
    state.consumers["gpu1"] = msgspec.structs.replace(
        state.consumers["gpu1"], server=ServerSnapshot(running=5, token_usage=0.2, at=1100.0))
    document = json.loads(msgspec.json.encode(to_report(summarize(SPEC, state, now=1110.0))))
    jsonschema.validate(document, committed)
    assert document["health"]["state"] == "stalled"
    assert document["instances"][1]["headroom"]["verdict"] == "yes"
    document["health"]["state"] = "fine"  # the schema constrains what it names
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, committed)


def test_group_summary_shows_members_shares_and_unowned_partitions() -> None:
    from ops.status import group_summary
    from ops.status_view import render_group
    from tokenmill.kafka.groups import GroupMember, GroupState

    state = GroupState(stable=True, members=(
        GroupMember("gpu0#0", (0,)), GroupMember("gpu0#1", (1,)), GroupMember("gpu0#2", ()),
        GroupMember("gpu1#0", (2,))))
    since: dict[int, float] = {}
    first = group_summary(state, 5, since, now=100.0)
    assert first["workers"]["gpu0"] == {"slots": 3, "standbys": 1, "partitions": [0, 1],
                                        "share": 0.4}
    assert first["workers"]["gpu1"]["share"] == 0.2
    assert first["unowned"] == {"3": 0.0, "4": 0.0}
    later = group_summary(state, 5, since, now=112.0)
    assert later["unowned"] == {"3": 12.0, "4": 12.0}  # for how long, across looks
    healed = GroupState(True, (*state.members, GroupMember("gpu1#1", (3, 4))))
    assert group_summary(healed, 5, since, now=120.0)["unowned"] == {} and since == {}
    assert render_group(later).row_count == 3  # two workers and the unowned row


def test_group_summary_of_the_classic_protocol_and_a_stranded_partition() -> None:
    from tokenmill.kafka.groups import GroupMember, GroupState, StrandedWatch

    stable = GroupState(True, (GroupMember("a#0", (0,)), GroupMember("b#0", (1,))))
    watch_a, watch_b = StrandedWatch("a#", grace_s=10), StrandedWatch("b#", grace_s=10)
    assert watch_a.check(stable, 3, now=0.0) == set()  # seen, not yet stranded
    assert watch_b.check(stable, 3, now=0.0) == set()
    assert watch_b.check(stable, 3, now=11.0) == set()  # b is not the first member
    assert watch_a.check(stable, 3, now=11.0) == {2}  # a repairs: it rejoins
    rebalancing = GroupState(False, stable.members)
    assert watch_a.check(rebalancing, 3, now=30.0) == set()  # only in a stable group
