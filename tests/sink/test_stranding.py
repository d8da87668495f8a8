"""No partition is ever stranded by a sink killed mid-rebalance: two sinks
own a run's completions, a newcomer joins, and one of the two dies at one
of ten named moments of the rebalance (tests/rebalance.py), detected from
what the sinks do; restarted with the same --instance, its partitions are
owned again by live members once its session expired. One run goes through
the ten phases, a test each, in order; the last test lets it finish: every
record exactly once in S3 or the DLQ. The sinks' uploads go through a gate
in front of the S3 server (tests/gate.py), which holds them from each
phase's start until the newcomer starts (or, where the phase says, until
the victim's revoke waits for its upload); the run cannot finish before the
last test (its last records and the producer's final checkpoint come then),
so every kill is mid-run. The workers' twin is
tests/consumer/test_stranding.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import CompletionRecord, RunSpec
from tests.gate import Gate, Hold
from tests.rebalance import (
    COMMITTING,
    PHASES,
    SESSION_S,
    Group,
    Run,
    Stage,
    module_settings,
    plays,
)
from tests.sink.sink_helpers import (
    SinkProcess,
    assert_exactly_once,
    create_run,
    feed,
    make_spec,
    publish_done,
    variant,
)
from tokenmill.kafka import topics
from tokenmill.progress import read_run_progress
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.s3, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 6
BATCH = 5
SINK_ARGS = ("--batch-size", str(BATCH), "--max-batch-age", "1",
             "--session-timeout", f"{SESSION_S:g}",
             "--create-bucket", "--heartbeat-interval", "120")  # no idle commits
KINDS = ["good"] * 4 + ["trivial", "failed"]


def _revoke_committing(s: Stage) -> None:
    """The victim's upload is held until its revoke has begun (and waits
    for it); released, the revoke commits it."""
    s.armed.touch()
    s.launch(keep=("victim",))
    s.event(s.victim, "fault injection: reached")  # its rebalance.revoke
    s.early["victim"].release()
    assert s.killed_itself(COMMITTING)["inside"] == "revoke"


def _first_commit(s: Stage) -> None:
    s.launch()
    s.event(s.newcomer, "partitions assigned", lambda e: e["partitions"])
    s.run.feed_more()  # records for the partitions it now owns
    s.event(s.newcomer, "batch committed")
    s.kill()


class Sinks(Run):
    started = "sink started"
    plays = plays(revoke_committing=(_revoke_committing, (
                      "--kill-at", COMMITTING, "--inside", "revoke",
                      "--report-at", "rebalance.revoke")),
                  first_commit=_first_commit)

    def __init__(self, settings: Settings, spec: RunSpec, gate: Gate, tmp_path: Path) -> None:
        self.settings, self.spec = settings, spec
        self.fed: list[CompletionRecord] = []
        super().__init__(gate, Group(settings, topics.sink_group(spec.run_id),
                                     topics.completions_topic(spec.run_id), PARTITIONS), tmp_path)

    def service(self, name: str, *faults: str) -> SinkProcess:
        until_done = () if name.startswith("new") else ("--until-done",)
        return SinkProcess(self.settings, self.spec.run_id, name, self.tmp_path / f"{name}.log",
                           *SINK_ARGS, *until_done,
                           env={"TOKENMILL_S3_ENDPOINT_URL": self.gate.url(name)},
                           faults=faults)

    def hold(self, name: str) -> Hold:
        """Its uploads of batches (not the bucket's creation, nor the store
        check's scratch objects)."""
        return self.gate.hold(callers={name}, methods={"PUT"}, paths=(
            f"/{self.settings.s3_bucket}/{self.spec.run_id}/partition=",))

    def feed_more(self) -> None:
        """A batch's worth of new records for every partition."""
        start = len(self.fed)
        records = [variant(self.spec, i, KINDS[i % len(KINDS)])
                   for i in range(start, start + PARTITIONS * BATCH)]
        feed(self.settings, self.spec, records, per_transaction=10, with_aborted=False)
        self.fed += records

    def prepare(self) -> None:
        self.feed_more()
        self.gate.wait(lambda: min(self.gate.count(n).held for n in self.early) >= 1, 60,
                       "an upload of each in flight, held")

    def unfinished(self) -> bool:
        return not read_run_progress(self.settings, self.spec.run_id).sink_done

    def finish(self) -> None:
        """The last records and the producer's final checkpoint: every record
        once in S3 or the DLQ."""
        self.gate.release()
        self.feed_more()
        publish_done(self.settings, self.spec.run_id, len(self.fed))
        self.finished()
        assert_exactly_once(self.settings, self.spec.run_id, {r.id for r in self.fed})


@pytest.fixture(scope="module")
def sinks(services, real_s3, tmp_path_factory) -> Iterator[Sinks]:
    tmp_path = tmp_path_factory.mktemp("stranding")
    with module_settings(services, tmp_path, real_s3) as settings:
        spec = make_spec(f"t{uuid.uuid4().hex[:12]}", partitions=PARTITIONS)
        create_run(settings, spec)
        with Gate(settings.s3_endpoint_url or "") as gate:
            with Sinks(settings, spec, gate, tmp_path) as run:
                yield run


@pytest.mark.parametrize("phase", PHASES)
def test_a_sink_killed_mid_rebalance_strands_nothing(sinks, phase) -> None:
    sinks.cycle(phase)


def test_the_run_then_finishes_exactly_once(sinks) -> None:
    sinks.finish()
