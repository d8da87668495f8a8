"""Exactly-once generation against a real broker and the SGLang simulator."""

from __future__ import annotations

import pytest

from schemas import Completion
from sglang_sim import SimulatorConfig, running_simulator
from tests.consumer.pipeline import (
    ConsumerProcess,
    committed_records,
    create_run,
    duplicates,
    make_prompts,
    publish,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# Paced so that the run lasts long enough (~10 s) for all three to join:
# with KIP-848 the first worker owns everything until the others arrive.
PACED = SimulatorConfig(time_scale=2.0, length_median=40, length_sigma=0.3, length_max=200)


def test_three_consumers_one_record_per_prompt(settings, run_id, tmp_path) -> None:
    spec = create_run(settings, run_id, partitions=6)
    prompts = make_prompts(run_id, 2000, tools_every=7)
    publish(settings, spec, prompts)
    with running_simulator(PACED) as url:
        workers = [ConsumerProcess(settings, run_id, url, f"w{i}", tmp_path, "--until-done",
                                   "--concurrency", "32").start() for i in range(3)]
        try:
            codes = [w.wait(180) for w in workers]
        finally:
            for w in workers:
                w.stop()
    assert codes == [0, 0, 0], [w.log()[-2000:] for w in workers]
    records = committed_records(settings, run_id)
    assert duplicates(records) == {}
    assert {r.id for r in records} == {p.id for p in prompts}
    assert all(r.settings_hash == spec.settings_hash for r in records)
    assert all(isinstance(r, Completion) for r in records)
    # Work was shared (on a loaded machine the last worker may join late).
    assert len({r.instance for r in records}) >= 2
