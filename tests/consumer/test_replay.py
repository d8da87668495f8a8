"""A replay run regenerates the parent's prompts with new settings, apart."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from ops.replay import ReplayRefused, create_replay, replay_spec
from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import (
    ConsumerProcess,
    committed_records,
    create_run,
    duplicates,
    make_prompts,
    publish,
)
from tokenmill.cli import cli
from tokenmill.registry import RunRegistry

pytestmark = [pytest.mark.broker]


def test_replay_spec_keeps_prompts_and_changes_settings() -> None:
    from schemas import GenerationSettings, RunSpec

    parent = RunSpec(run_id="p", partitions=8, generation=GenerationSettings(max_tokens=4096))
    child = replay_spec(parent, "c", {"max_tokens": 8192}, {})
    assert child.prompts_topic == "tokenmill.p.prompts"
    assert child.parent_run == "p" and child.partitions == 8
    assert child.generation.max_tokens == 8192
    assert child.settings_hash != parent.settings_hash


def test_replay_generates_every_prompt_again_under_its_own_run(settings, run_id, tmp_path) -> None:
    parent = create_run(settings, run_id, partitions=3, max_tokens=64)
    prompts = make_prompts(run_id, 150)
    publish(settings, parent, prompts)
    child_id = f"{run_id}-8k"
    result = CliRunner().invoke(cli, ["runs", "replay", child_id, "--parent", run_id,
                                      "--max-tokens", "128",
                                      "--bootstrap-servers", settings.bootstrap_servers])
    assert result.exit_code == 0, result.output
    child = RunRegistry(settings).get(child_id)
    with running_simulator(SimulatorConfig(zero_delay=True, length_median=40)) as url:
        worker = ConsumerProcess(settings, child_id, url, "r0", tmp_path, "--until-done").start()
        try:
            assert worker.wait(120) == 0, worker.log()[-2000:]
        finally:
            worker.stop()
    records = committed_records(settings, child_id)
    assert duplicates(records) == {}
    assert {r.id for r in records} == {p.id for p in prompts}
    assert {r.settings_hash for r in records} == {child.settings_hash}
    assert child.settings_hash != parent.settings_hash
    assert all(r.usage.completion_tokens <= 128 for r in records)


def test_replay_of_an_unfinished_parent_is_refused(settings, run_id) -> None:
    create_run(settings, run_id, partitions=1)
    with pytest.raises(ReplayRefused, match="not fully published"):
        create_replay(settings, run_id, f"{run_id}-b", {"max_tokens": 10}, {})
