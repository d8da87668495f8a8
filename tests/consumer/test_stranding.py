"""No partition is ever stranded by a worker killed mid-rebalance: two
workers own a run, a newcomer joins, and one of the two dies at one of ten
named moments of the rebalance (tests/rebalance.py), detected from what the
workers do; restarted with the same --instance, its partitions are owned
again by live members once its session expired. One run goes through the
ten phases, a test each, in order; the last test lets it finish, exactly
once. A gate in front of the simulator (tests/gate.py) holds the last
prompt of every partition until then, so every kill is mid-run, and holds
the workers' other requests except where a phase needs them answered, so
the run stays small. On the real broker, KIP-848 with one group member per
worker (no fleet balancing: the rebalance is the one the newcomer's join
causes). The sinks' twin is tests/sink/test_stranding.py."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_sim import running_simulator
from tests.consumer.pipeline import (
    PACED,
    ConsumerProcess,
    check_exactly_once,
    consumer_progress,
    create_run,
    make_prompts,
    publish,
)
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
from tests.service_process import ServiceProcess
from tokenmill.kafka import topics
from tokenmill.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(300)]

PARTITIONS = 6
PER_PARTITION = 20
QUESTION = re.compile(rb"Question (\d+):")  # a prompt's text (make_prompts): its seq
# 6 in flight over a member's 3 partitions (not always on each: phase 6 sees to it).
WORKER_ARGS = ("--concurrency", "6", "--no-fleet-balancing",
               "--heartbeat-interval", "120")  # no idle commits: phase 4 is a real one


def _answered_partitions(gate: Gate, caller: str, since: int) -> set[int]:
    """The partitions of the prompts the server answered `caller` (of the
    gate's answers after the first `since`)."""
    seqs = (QUESTION.search(a.body) for a in gate.answered[since:] if a.caller == caller)
    return {int(m.group(1)) % PARTITIONS for m in seqs if m}


def _revoke_committing(s: Stage) -> None:
    """Armed, the victim's interval commits are refused (tests/faults.py);
    its requests are answered until it holds results on every partition it
    owns, so whichever it gives up, its revoke has results to commit."""
    s.armed.touch()
    owned, since = s.group.owned("victim"), len(s.gate.answered)
    s.early["victim"].release()
    s.gate.wait(lambda: owned <= _answered_partitions(s.gate, "victim", since), 60,
                f"the victim's results on each of {sorted(owned)}")
    s.early["victim"].again()
    s.launch(keep=("victim",))
    assert s.killed_itself(COMMITTING)["inside"] == "revoke"


def _first_commit(s: Stage) -> None:
    s.launch()
    s.early[s.new].release()  # the moved partitions' prompts go to the newcomer
    s.event(s.newcomer, "fault injection: reached")  # its transaction.committed
    assert s.gate.count(s.new).answered  # what it committed were results
    s.kill()


class Workers(Run):
    started = "consuming"
    # Every worker's requests wait in the gate through a rebalance (requests
    # in flight when partitions move), but where a phase needs answers:
    # the run is not spent before the last phase.
    flowing = ()
    plays = plays(revoke_committing=(_revoke_committing, (
                      "--kill-at", COMMITTING, "--inside", "revoke", "--refuse-outside")),
                  first_commit=_first_commit)

    def __init__(self, settings: Settings, run_id: str, prompts: list, gate: Gate,
                 tmp_path: Path) -> None:
        self.settings, self.run_id, self.prompts = settings, run_id, prompts
        # the last prompt of every partition: the run cannot finish until released
        self.last = gate.hold(containing=[f"Question {p.seq}:" for p in prompts[-PARTITIONS:]])
        super().__init__(gate, Group(settings, topics.generate_group(run_id),
                                     topics.prompts_topic(run_id), PARTITIONS), tmp_path)

    def service(self, name: str, *faults: str) -> ConsumerProcess:
        if name.startswith("new"):  # its first commit is a phase
            faults = ("--report-at", "transaction.committed")
        until_done = () if name.startswith("new") else ("--until-done",)
        return ConsumerProcess(self.settings, self.run_id, self.gate.url(name), name,
                               self.tmp_path, *WORKER_ARGS, *until_done, faults=faults,
                               session_s=SESSION_S)

    def hold(self, name: str) -> Hold:
        return self.gate.hold(callers={name})

    def newcomer_holds(self, name: str) -> dict[str, Hold]:
        return {name: self.hold(name)}

    def prepare(self) -> None:
        self.gate.wait(lambda: min(self.gate.count(n).held for n in self.early)
                       >= PARTITIONS // 2, 60, "work in flight, held, on every partition")

    def unfinished(self) -> bool:
        return consumer_progress(self.settings, self.run_id).generated < len(self.prompts)

    def after_kill(self, holds: dict[str, Hold]) -> None:
        for hold in holds.values():
            hold.again()

    def ready_to_leave(self, newcomer: ServiceProcess) -> bool:
        """It saw the others (its fleet watch's first look, every 3 s): a
        worker that has not drains its requests on SIGTERM as if alone, and
        the newcomer's are held here (ci25: SIGKILLed after 30 s)."""
        return bool(newcomer.events("fleet: other workers in the group"))

    def finish(self) -> None:
        """The last prompts answered: every prompt committed once."""
        self.gate.release()
        self.finished()
        check_exactly_once(self.settings, self.run_id, self.prompts)


@pytest.fixture(scope="module")
def workers(services, tmp_path_factory) -> Iterator[Workers]:
    tmp_path = tmp_path_factory.mktemp("stranding")
    with module_settings(services, tmp_path) as settings:
        run_id = f"t{uuid.uuid4().hex[:12]}"
        spec = create_run(settings, run_id, partitions=PARTITIONS)
        prompts = make_prompts(run_id, PARTITIONS * PER_PARTITION)
        publish(settings, spec, prompts)
        with running_simulator(PACED) as upstream, Gate(upstream) as gate:
            with Workers(settings, run_id, prompts, gate, tmp_path) as run:
                yield run


@pytest.mark.parametrize("phase", PHASES)
def test_a_worker_killed_mid_rebalance_strands_nothing(workers, phase) -> None:
    workers.cycle(phase)


def test_the_run_then_finishes_exactly_once(workers) -> None:
    workers.finish()
