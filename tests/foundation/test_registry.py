import time

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource

from schemas import GenerationSettings, RunSpec
from tokenmill import progress
from tokenmill.kafka import topics
from tokenmill.registry import RunConflict, RunRegistry, UnknownRun, spec_differences

pytestmark = pytest.mark.broker


def test_write_and_read_back(settings, run_id) -> None:
    registry = RunRegistry(settings)
    spec = RunSpec(run_id=run_id, partitions=3,
                   generation=GenerationSettings(model="m", max_tokens=4096))
    assert registry.register(spec) is True
    assert registry.get(run_id) == spec


def test_identical_rewrite_is_a_no_op(settings, run_id) -> None:
    registry = RunRegistry(settings)
    spec = RunSpec(run_id=run_id, partitions=2)
    assert registry.register(spec) is True
    assert registry.register(RunSpec(run_id=run_id, partitions=2)) is False
    assert registry.get(run_id) == spec


def test_conflicting_rewrite_is_refused_naming_the_run(settings, run_id) -> None:
    registry = RunRegistry(settings)
    registry.register(RunSpec(run_id=run_id, partitions=2,
                              generation=GenerationSettings(max_tokens=4096)))
    with pytest.raises(RunConflict) as refused:
        registry.register(RunSpec(run_id=run_id, partitions=2,
                                  generation=GenerationSettings(max_tokens=8192)))
    assert run_id in str(refused.value)
    assert "generation.max_tokens: 4096 -> 8192" in str(refused.value)
    assert registry.get(run_id).generation.max_tokens == 4096


def test_unknown_run_is_named(settings, run_id) -> None:
    with pytest.raises(UnknownRun, match=run_id):
        RunRegistry(settings).get(run_id)


def test_creating_a_run_creates_its_topics(settings, services, run_id) -> None:
    RunRegistry(settings).create_run(RunSpec(run_id=run_id, partitions=5))
    admin = KafkaAdminClient(bootstrap_servers=services.bootstrap_servers)
    try:
        described = admin.describe_topics(
            [topics.prompts_topic(run_id), topics.completions_topic(run_id),
             topics.dlq_topic(run_id)])
        described = {t.get("topic", t.get("name")): len(t["partitions"]) for t in described}
        runs_config = admin.describe_configs(
            config_resources=[ConfigResource("TOPIC", topics.RUNS_TOPIC)])
    finally:
        admin.close()
    assert described == {topics.prompts_topic(run_id): 5, topics.completions_topic(run_id): 5,
                         topics.dlq_topic(run_id): 5}
    assert "compact" in str(runs_config)


def test_the_progress_topic_is_compacted_in_short_segments(settings, services, run_id) -> None:
    """Readers scan the progress topic to its end every few seconds: its
    segments roll every 10 minutes so the cleaner can compact them (the
    broker's default would keep a week of records in one open segment)."""
    progress.ensure_topic(settings, run_id)
    admin = KafkaAdminClient(bootstrap_servers=services.bootstrap_servers)
    topic = topics.progress_topic(run_id)
    entries: dict[str, str] = {}
    deadline = time.monotonic() + 60
    try:
        # A describe right after the create can come back empty while the
        # new topic's metadata spreads (seen once on a loaded machine).
        while "cleanup.policy" not in entries and time.monotonic() < deadline:
            described = admin.describe_configs([ConfigResource("TOPIC", topic)])
            entries = {key: str(value["value"])
                       for key, value in described["topic"].get(topic, {}).items()}
            if "cleanup.policy" not in entries:
                time.sleep(0.5)  # poll of a wait loop
    finally:
        admin.close()
    assert entries["cleanup.policy"] == "compact"
    assert entries["segment.ms"] == str(10 * 60 * 1000)
    assert float(entries["min.cleanable.dirty.ratio"]) == 0.1


def test_spec_differences_lists_changed_paths() -> None:
    a = RunSpec(run_id="a", partitions=1)
    b = RunSpec(run_id="a", partitions=2, multi_turn="strip-assistant")
    assert spec_differences(a, b) == ["multi_turn: 'last-user' -> 'strip-assistant'",
                                      "partitions: 1 -> 2"]
