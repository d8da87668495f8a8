"""Ten named moments of a rebalance, for the stranding tests of workers
(tests/consumer/test_stranding.py) and sinks (tests/sink/test_stranding.py).

Two members own a run's partitions ("steady" and "victim", half each); a
newcomer joins, and the victim dies at one of these moments of the
rebalance that follows, each detected from what the services do (their
JSON log, the group's description, the crash points of tests/faults.py),
never from a timer:

1.  newcomer-launched             the newcomer's process was just started
                                  (it has logged nothing yet)
2.  newcomer-started              the newcomer logged its start ("consuming" /
                                  "sink started")
3.  newcomer-in-group             the group's description lists the newcomer
4.  victim-committing-after-join  the victim dies inside its first transaction
                                  after the newcomer joined (offsets sent, not
                                  committed: crash point transaction.committing)
5.  victim-revoke-begins          the victim dies as its revoke callback begins,
                                  with work in flight (crash point
                                  rebalance.revoke)
6.  victim-revoke-committing      the victim dies inside the commit its revoke
                                  makes (transaction.committing inside revoke)
7.  victim-revoked                the victim logged "partitions revoked"
8.  newcomer-assigned             the newcomer logged its first non-empty
                                  "partitions assigned"
9.  newcomer-first-commit         the newcomer committed its first results
10. rebalance-settled             the group is stable again: every member holds
                                  its target assignment, the newcomer its share

One run goes through the phases in turn (`Run.cycle`, one test each, the
run a module fixture's), and its last test lets it finish exactly once.
Until then the run cannot finish (a gate holds it, tests/gate.py, or its
last records are not there yet), so every kill is mid-run by construction,
and the test asserts it. After each kill the victim restarts with the same
--instance; once its dead member is gone, every partition must be in a live
member's target assignment at once (none stranded) and owned again within
the session timeout and a reconciliation. The newcomer then leaves.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from tests.gate import Gate, Hold
from tests.service_process import ServiceProcess
from tokenmill.kafka import clients
from tokenmill.settings import Settings

# How the group coordinator refuses the offsets of a member that is not the
# member it was (left, expired, or of an older epoch): a zombie's late commit.
STALE_MEMBER = r"UNKNOWN_MEMBER_ID|FENCED_MEMBER_EPOCH|STALE_MEMBER_EPOCH|ILLEGAL_GENERATION"

PHASES = ("newcomer-launched", "newcomer-started", "newcomer-in-group",
          "victim-committing-after-join", "victim-revoke-begins", "victim-revoke-committing",
          "victim-revoked", "newcomer-assigned", "newcomer-first-commit", "rebalance-settled")

# The services' session here: a dead member's expiry is most of each phase
# (ten a file). The broker's floor is 3 s (deploy/kafka/server.properties);
# at 4 s a live member still has eight heartbeats' margin.
SESSION_S = 4.0
# KIP-848, the group's heartbeat interval at this session timeout
# (tokenmill/kafka/groups.py: a tenth of it, at least 0.5 s).
HEARTBEAT_S = max(0.5, SESSION_S / 10)
# After a member's session expired, the live members reconcile: the owner
# of a partition the assignor moves revokes it (and commits) at a heartbeat
# and acknowledges at the next, the receiver reads its committed offsets
# and acknowledges in turn. A dead member's partitions are owned again
# within the session timeout and this; a stranded one never is.
RECONCILE_S = 15.0


@dataclass(frozen=True)
class Member:
    client_id: str
    member_id: str
    owned: frozenset[int]
    target: frozenset[int] | None


class Group:
    """A consumer group seen from outside, through one admin client."""

    def __init__(self, settings: Settings, group: str, topic: str, partitions: int) -> None:
        self.admin = clients.admin(settings)
        self.group = group
        self.topic = topic
        self.partitions = partitions

    def members(self) -> list[Member] | None:
        """The members now; None when the broker did not answer in time."""
        try:
            described = self.admin.describe_consumer_groups(
                [self.group], request_timeout=10)[self.group].result()
        except KafkaException:
            return None
        out = []
        for m in described.members:
            target = getattr(m, "target_assignment", None)
            out.append(Member(
                m.client_id or "", m.member_id,
                frozenset(tp.partition for tp in m.assignment.topic_partitions
                          if tp.topic == self.topic),
                None if target is None else frozenset(
                    tp.partition for tp in target.topic_partitions if tp.topic == self.topic)))
        return out

    def wait(self, condition: Callable[[list[Member]], Any], timeout_s: float, what: str) -> Any:
        """Describe the group until `condition(members)` holds; its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            members = self.members()
            value = condition(members) if members is not None else None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout_s}s; members: {members}")
            time.sleep(0.05)  # the poll of this wait loop

    def ids(self, worker: str) -> set[str]:
        """Member ids of `worker`'s members now (client ids `<worker>#<n>`)."""
        members = self.wait(lambda ms: ms, 30, "the group's description")
        return {m.member_id for m in members if m.client_id.startswith(f"{worker}#")}

    def owned(self, worker: str) -> frozenset[int]:
        """The partitions `worker`'s member owns now."""
        members = self.wait(lambda ms: ms, 30, "the group's description")
        return frozenset(p for m in members if m.client_id.startswith(f"{worker}#")
                         for p in m.owned)

    def wait_shared(self, services: dict[str, ServiceProcess], timeout_s: float = 60) -> None:
        """Until the group is stable with each service's member owning an
        equal share, and each service has taken its share (its log says so)."""
        share = self.partitions // len(services)

        def shared(members: list[Member]) -> bool:
            return stable(members) and all(
                caught_up(service, name, members)
                and sum(len(m.owned) for m in members if m.client_id.startswith(f"{name}#"))
                == share for name, service in services.items())

        self.wait(shared, timeout_s, f"{sorted(services)} each owning {share} partitions")


def joined(worker: str) -> Callable[[list[Member]], bool]:
    return lambda members: any(m.client_id.startswith(f"{worker}#") for m in members)


def stable(members: list[Member]) -> bool:
    """Every member holds its target assignment: no move under way."""
    return all(m.target is not None and m.owned == m.target for m in members)


def caught_up(service: ServiceProcess, name: str, members: list[Member]) -> bool:
    """What `service` (this start of it) last logged owning is what the
    group says it owns."""
    changes = [e for e in service.events(since=service.start_mark) if e.get("event") in (
        "partitions assigned", "partitions revoked", "partitions lost")]
    mine = [m.owned for m in members if m.client_id.startswith(f"{name}#")]
    return bool(changes) and len(mine) == 1 and set(changes[-1]["owned"]) == set(mine[0])


def balanced(partitions: int) -> Callable[[list[Member]], bool]:
    """Stable, with the partitions spread evenly: the assignor is done."""
    def check(members: list[Member]) -> bool:
        sizes = [len(m.owned) for m in members]
        return (stable(members) and sum(sizes) == partitions
                and max(sizes) - min(sizes) <= 1)
    return check


def settled(worker: str, share: int) -> Callable[[list[Member]], bool]:
    """The group is stable and `worker` owns `share`."""
    def check(members: list[Member]) -> bool:
        mine = [m for m in members if m.client_id.startswith(f"{worker}#")]
        return len(mine) == 1 and len(mine[0].owned) == share and stable(members)
    return check


@dataclass
class Healing:
    """Seconds from the kill until the group's description first showed the
    dead members gone (`expired_s`), every partition in a live member's
    target assignment (`targeted_s`: none left to nobody) and every
    partition owned by a live member (`healed_s`), each counted to the start
    of that description: how long the broker took to answer one
    (`describe_s`, the longest) is the measurement's, not the group's."""

    expired_s: float
    targeted_s: float
    healed_s: float
    describe_s: float


def heal(group: Group, dead: set[str], killed_at: float) -> Healing:
    """Wait (up to a minute: the bounds are asserted by the caller) until
    the dead members are gone and every partition is owned by a live one."""
    seen: dict[str, float] = {}
    slowest = 0.0
    everything = set(range(group.partitions))
    deadline = time.monotonic() + 60
    while True:
        asked = time.monotonic()
        members = group.members()
        slowest = max(slowest, time.monotonic() - asked)
        if members is not None:
            live = [m for m in members if m.member_id not in dead]
            if len(live) == len(members):
                seen.setdefault("expired", asked)
            if "expired" in seen and {p for m in live for p in m.target or m.owned} == everything:
                seen.setdefault("targeted", asked)
            if "targeted" in seen and {p for m in live for p in m.owned} == everything:
                return Healing(seen["expired"] - killed_at, seen["targeted"] - killed_at,
                               asked - killed_at, slowest)
        assert time.monotonic() < deadline, f"not healed within 60s: {members}"
        time.sleep(0.05)  # the poll of this wait loop


def assert_healed_in_time(healing: Healing) -> None:
    """Once the dead member was gone, the assignor gave every partition to a
    live member at once (none left to nobody: stranded), and they were
    owned again within the group's session timeout (not the broker's
    default of 45 s) and a reconciliation."""
    assert healing.targeted_s - healing.expired_s <= 2 * HEARTBEAT_S, healing
    assert healing.healed_s <= SESSION_S + RECONCILE_S, healing


def killed_itself(victim: ServiceProcess, since: int, point: str) -> dict[str, Any]:
    """The victim died at its crash point `point`: its event, after `since`."""
    try:
        code = victim.wait(120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the victim did not die at {point} within 120s") from None
    events = victim.events("fault injection: killed", since)
    assert code == 137 and events and events[-1]["point"] == point, victim.log()[-3000:]
    return events[-1]


# -- one run, ten rebalances ---------------------------------------------------------

COMMITTING = "transaction.committing"
Faults = tuple[str, ...]


@contextmanager
def module_settings(services: Any, tmp_path: Path, s3: Any = None) -> Iterator[Settings]:
    """What the `settings` fixture gives a test, for a module's run; `s3`:
    the session's `real_s3` for the S3-facing tests (tests/conftest.py)."""
    endpoint, key, secret = (services.s3_endpoint_url, services.s3_access_key,
                             services.s3_secret_key)
    if s3 is not None:
        endpoint, key, secret = s3.endpoint_url, s3.access_key, s3.secret_key
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", key)
        env.setenv("AWS_SECRET_ACCESS_KEY", secret)
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield Settings(bootstrap_servers=services.bootstrap_servers, s3_endpoint_url=endpoint,
                       s3_bucket=f"tm-{uuid.uuid4().hex[:12]}", state_dir=tmp_path / "state",
                       connect_timeout_s=10.0)


@dataclass
class Stage:
    """One phase's rebalance: the run, its newcomer (`new`, a name of its
    own), and what the test saw."""

    run: Run
    newcomer: ServiceProcess
    new: str
    armed: Path  # tests/faults.py counts the victim's crash point once this exists
    early: dict[str, Hold]  # the services' work held before the newcomer starts
    mark: int = 0  # the victim's log before the newcomer started
    abandoned: int = 0  # the victim's held requests hung up on, before
    killed_at: float = 0.0
    hit: dict[str, object] = field(default_factory=dict)

    @property
    def gate(self) -> Gate:
        return self.run.gate

    @property
    def group(self) -> Group:
        return self.run.group

    @property
    def victim(self) -> ServiceProcess:
        return self.run.victim

    def launch(self, *, keep: tuple[str, ...] = ()) -> None:
        """Start the newcomer; release the early holds of the role's
        `flowing` services (their work goes on through the rebalance) but
        `keep` these; the others' stay held."""
        self.mark = self.victim.mark()
        self.abandoned = self.gate.count("victim").abandoned
        self.newcomer.start()
        for name in self.run.flowing:
            if name not in keep:
                self.early[name].release()

    def kill(self) -> None:
        self.victim.kill()
        self.killed_at = time.monotonic()

    def killed_itself(self, point: str) -> dict[str, Any]:
        """The victim died at its crash point `point`."""
        event = killed_itself(self.victim, self.mark, point)
        self.killed_at = time.monotonic()
        self.hit["killed"] = event
        return event

    def event(self, service: ServiceProcess, name: str,
              check: Callable[[dict[str, Any]], Any] = lambda e: True) -> dict[str, Any]:
        """Wait for `service`'s event `name` (after the newcomer's launch)."""
        since = self.mark if service is self.victim else 0
        found = self.gate.wait(lambda: next((e for e in service.events(name, since)
                                             if check(e)), None), 120, f"{name!r}")
        self.hit["event"] = found
        return found

    def joined(self) -> None:
        self.hit["joined"] = self.group.wait(joined(self.new), 120, "the newcomer in the group")


def _launched(s: Stage) -> None:
    s.launch()
    s.kill()
    assert not s.newcomer.events(s.run.started), "the kill came after the newcomer's start"


def _started(s: Stage) -> None:
    s.launch()
    s.event(s.newcomer, s.run.started)
    s.kill()


def _in_group(s: Stage) -> None:
    s.launch()
    s.joined()
    s.kill()


def _committing_after_join(s: Stage) -> None:
    s.launch(keep=("victim",))
    s.joined()
    s.armed.touch()  # the victim's next transaction is its last
    s.early["victim"].release()
    s.killed_itself(COMMITTING)


def _revoke_begins(s: Stage) -> None:
    s.armed.touch()
    s.launch(keep=("victim",))
    s.killed_itself("rebalance.revoke")
    # it died with its held work in flight: the gate was hung up on
    s.gate.wait(lambda: s.gate.count("victim").abandoned > s.abandoned, 30,
                "the victim's held work hung up on")


def _revoked(s: Stage) -> None:
    s.launch()
    s.event(s.victim, "partitions revoked", lambda e: e["partitions"])
    s.kill()


def _assigned(s: Stage) -> None:
    s.launch()
    s.event(s.newcomer, "partitions assigned", lambda e: e["partitions"])
    s.kill()


def _settled(s: Stage) -> None:
    s.launch()
    s.hit["settled"] = s.group.wait(settled(s.new, s.group.partitions // 3), 120,
                                    "the group settled with the newcomer's share")
    s.kill()


Play = Callable[[Stage], None]


def plays(revoke_committing: tuple[Play, Faults], first_commit: Play
          ) -> dict[str, tuple[Play, Faults]]:
    """Each phase's play and the victim's tests/faults.py options; the two
    plays that differ between workers and sinks are the caller's."""
    out: dict[str, tuple[Play, Faults]] = {
        "newcomer-launched": (_launched, ()),
        "newcomer-started": (_started, ()),
        "newcomer-in-group": (_in_group, ()),
        "victim-committing-after-join": (_committing_after_join, ("--kill-at", COMMITTING)),
        "victim-revoke-begins": (_revoke_begins, ("--kill-at", "rebalance.revoke")),
        "victim-revoke-committing": revoke_committing,
        "victim-revoked": (_revoked, ()),
        "newcomer-assigned": (_assigned, ()),
        "newcomer-first-commit": (first_commit, ()),
        "rebalance-settled": (_settled, ()),
    }
    assert tuple(out) == PHASES
    return out


class Run:
    """One run owned by "steady" and "victim", through which the phases
    pass one after the other (one test each, in PHASES order; the run is
    set up once, by a module fixture). A role (workers, sinks) says how its
    services start and how their work is held.

    Parameters: `gate`, `group`, `tmp_path`."""

    started = ""  # the event a service logs once it runs
    plays: dict[str, tuple[Play, Faults]] = {}
    # whose work goes on through a rebalance, unless a phase says otherwise
    flowing: tuple[str, ...] = ("steady", "victim")

    def __init__(self, gate: Gate, group: Group, tmp_path: Path) -> None:
        self.gate = gate
        self.group = group
        self.tmp_path = tmp_path
        self.early = {name: self.hold(name) for name in ("steady", "victim")}
        self.newcomers: list[ServiceProcess] = []
        self.victim_args: Faults = ()
        self.steady = self.service("steady").start()
        self.victim = self.service("victim").start()
        try:
            self.group.wait_shared(self.pair())
        except BaseException:
            self.__exit__()
            raise

    def pair(self) -> dict[str, ServiceProcess]:
        return {"steady": self.steady, "victim": self.victim}

    # -- the role's ---------------------------------------------------------------

    def service(self, name: str, *faults: str) -> ServiceProcess:
        raise NotImplementedError

    def hold(self, name: str) -> Hold:
        """A hold of `name`'s work."""
        raise NotImplementedError

    def newcomer_holds(self, name: str) -> dict[str, Hold]:
        """Holds of the newcomer's work, by name (its own, or none)."""
        return {}

    def prepare(self) -> None:
        """Until the steady's and the victim's work is in flight, held."""

    def unfinished(self) -> bool:
        raise NotImplementedError

    def ready_to_leave(self, newcomer: ServiceProcess) -> bool:
        """Whether the newcomer, stopped now, leaves as a member of a group
        (its role's event for "I have seen the others")."""
        return True

    def after_kill(self, holds: dict[str, Hold]) -> None:
        """The early holds once the victim died or before it stops: released
        (the restart and the newcomer's leaving need the work to go on)."""
        for hold in holds.values():
            hold.release()

    # -- the cycle ------------------------------------------------------------------

    def victim_faults(self, phase: str) -> Faults:
        faults = self.plays[phase][1]
        return ("--armed-by", str(self.tmp_path / f"armed-{phase}"), *faults) if faults else ()

    def victim_for(self, phase: str) -> None:
        """The victim running with `phase`'s faults (restarted if not)."""
        wanted = self.victim_faults(phase)
        if self.victim.running() and wanted == self.victim_args:
            # as the phase before left the group (or, had it failed, as it
            # is once that phase's leftovers are gone: each phase starts
            # from the same place)
            self.group.wait_shared(self.pair())
            return
        self.after_kill(self.early)  # e.g. a sink's revoke waits for its held upload
        self.victim.stop()
        self.victim, self.victim_args = self.service("victim", *wanted).start(), wanted
        self.group.wait_shared(self.pair())

    def cycle(self, phase: str) -> Stage:
        """The newcomer joins, the victim dies at `phase`, the victim
        restarts (with the next phase's faults), every partition is owned
        again in time; the newcomer leaves."""
        index = PHASES.index(phase)
        play, _faults = self.plays[phase]
        times = [("start", time.monotonic())]
        self.victim_for(phase)
        for hold in self.early.values():
            hold.again()
        self.prepare()
        times.append(("prepared", time.monotonic()))
        dead = self.group.ids("victim")
        new = f"new{index + 1}"
        early = {**self.early, **self.newcomer_holds(new)}
        stage = Stage(self, self.service(new), new, self.tmp_path / f"armed-{phase}", early)
        self.newcomers.append(stage.newcomer)
        try:
            try:
                play(stage)
                assert stage.killed_at, "the victim still runs"
                assert self.unfinished(), "the run finished before the kill"
            finally:
                self.after_kill(early)
                following = PHASES[index + 1] if index + 1 < len(PHASES) else None
                if not self.victim.running():
                    self.victim_args = self.victim_faults(following) if following else ()
                    self.victim = self.service("victim", *self.victim_args).start()
            times.append(("played", time.monotonic()))
            healing = heal(self.group, dead, stage.killed_at)
            stage.hit["healing"] = healing
            times.append(("healed", time.monotonic()))
            # The newcomer leaves once the assignor is done and it took what
            # it was given: each phase ends the same way, with a clean leave
            # of a member that owns its share.
            self.group.wait(lambda ms: balanced(self.group.partitions)(ms)
                            and caught_up(stage.newcomer, stage.new, ms)
                            and self.ready_to_leave(stage.newcomer), 60,
                            "the assignor done, and the newcomer with it")
        except AssertionError as exc:
            raise AssertionError(f"{phase}: {exc}\n"
                                 f"{logs((self.steady, self.victim, stage.newcomer))}") from None
        finally:
            times.append(("balanced", time.monotonic()))
            stage.newcomer.stop()
            times.append(("newcomer stopped", time.monotonic()))
        assert stage.newcomer.proc is not None and stage.newcomer.proc.returncode == 0, \
            stage.newcomer.log()[-3000:]
        self.group.wait_shared(self.pair())
        times.append(("shared", time.monotonic()))
        stage.hit["times"] = [(n, round(t - times[0][1], 1)) for n, t in times]
        assert_healed_in_time(healing)
        print(f"{phase}: {stage.hit}")  # what was seen, with -s
        return stage

    def finished(self) -> None:
        """The steady and the victim (`--until-done`) exit 0."""
        for process in (self.steady, self.victim):
            assert process.wait(120) == 0, process.log()[-3000:]

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *_exc: object) -> None:
        for process in (self.steady, self.victim, *self.newcomers):
            process.stop()


def logs(processes: tuple[ServiceProcess, ...]) -> str:
    """The end of each process's log, for a failure's message."""
    return "\n".join(f"--- {p.log_path.name}:\n{p.log()[-4000:]}" for p in processes)
