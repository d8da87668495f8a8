"""Capacity-weighted partition ownership, decided by each worker for itself.

Kafka's group machinery does every assignment (KIP-848, the broker's
`uniform` assignor); tokenmill only chooses how many group members each
worker runs. A worker runs one member ("slot") per partition it should own:
with at least as many members as partitions, the assignor gives every
member at most one partition, so a worker's share of the run is its number
of slots, and closing one slot hands over exactly one partition.

Each worker observes the same fleet (group members and their partitions,
every partition's remaining records, each worker's measured rate) and acts
only on its own slots:

- start: when the run knows its planned GPU count, a worker opens its
  equal share of slots at once (`initial_slots`), so an equal fleet starts
  with one partition per member and nothing has to move;
- split: a slot that owns several partitions (after a crash, or at start)
  gets company: the worker opens slots until every member owns at most one;
- demand: a worker that will run out of work well before the fleet
  (its ETA below the fleet's by more than the slack) opens a standby slot,
  a member with no partition, and closes it when the demand is gone;
- donate: a worker whose ETA is above the fleet's, seeing other workers'
  standbys, closes for each the slot whose partition, moved there,
  shortens the longer of the two ETAs the most, counting the requests the
  receiver must redo. The assignor gives a freed partition to a standby (a
  member without one). The worker drains the slot briefly first
  (`consumer/handover.py`).

Rates come from committed offsets, counted only once a worker's first
results are in (`RateTracker`), and nothing moves until some are known.
So a mixed fleet converges to shares proportional to measured rates, an
equal one does not move at all, and near the end idle workers take over
the remaining work of slower ones, wasting at most the in-flight requests
of the partitions that move.

Everything here is pure: the view comes from `consumer/fleet_view.py`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import msgspec

SLOT_SEPARATOR = "#"


class Member(msgspec.Struct, frozen=True):
    worker: str
    slot: str  # this member's client id: "<worker>#<n>"
    partitions: tuple[int, ...]


class FleetView(msgspec.Struct, frozen=True):
    at: float  # monotonic seconds of the observation
    stable: bool  # every member owns its target assignment (no move under way)
    members: tuple[Member, ...]
    committed: Mapping[int, int]  # partition -> committed input offset
    end: Mapping[int, int]  # partition -> last stable offset
    partitions: int

    def backlog(self, partition: int) -> int:
        """Records left, about: the producer's commit marker after a
        partition's last record takes one offset, so a finished partition
        shows end - committed == 1."""
        return max(0, self.end.get(partition, 0) - self.committed.get(partition, 0) - 1)

    def owner(self) -> dict[int, str]:
        return {p: m.worker for m in self.members for p in m.partitions}

    def workers(self) -> set[str]:
        return {m.worker for m in self.members}

    def worker_backlog(self, worker: str) -> int:
        return sum(self.backlog(p) for m in self.members if m.worker == worker
                   for p in m.partitions)

    def worker_backlog_of_slot(self, slot: str) -> int:
        return sum(self.backlog(p) for m in self.members if m.slot == slot for p in m.partitions)

    def total_backlog(self) -> int:
        return sum(self.backlog(p) for p in range(self.partitions))


class Params(msgspec.Struct, frozen=True):
    min_slack_s: float = 5.0  # ETA differences below this are noise
    slack_share: float = 0.1  # ... or below this share of the fleet's ETA
    max_open_per_round: int = 4
    max_slots: int = 256


class Decision(msgspec.Struct, frozen=True):
    open: int = 0  # new slots to open
    close: tuple[str, ...] = ()  # slots (client ids) to close
    why: str = ""


def slot_name(worker: str, number: int) -> str:
    return f"{worker}{SLOT_SEPARATOR}{number}"


def worker_of(client_id: str) -> str:
    return client_id.rsplit(SLOT_SEPARATOR, 1)[0]


# -- rates ---------------------------------------------------------------------

class RateTracker:
    """Each worker's capacity in records/s, from how fast the committed
    offsets of the partitions it owned moved between two views.

    A worker's first results come a request latency after it starts, all
    at once, so the intervals before and including its first commit say
    nothing about its rate (counted, a GPU that simply started later looks
    dead, and the fleet hands it nothing or takes its work). Counting starts
    after that; idle intervals do not count either (an idle worker keeps its
    capacity). Records and seconds are summed with a `halflife_s` decay, and
    a worker's rate is known once `min_measured_s` seconds are counted: one
    3 s view holds one or two of its commits, too bursty to act on. Workers
    not measured yet get the fleet's median.
    """

    def __init__(self, halflife_s: float = 30.0, min_measured_s: float = 10.0) -> None:
        self.halflife_s = halflife_s
        self.min_measured_s = min_measured_s
        self._sums: dict[str, tuple[float, float]] = {}  # worker -> (records, seconds)
        self._producing: set[str] = set()  # seen committing: its pipeline is full
        self._last: FleetView | None = None

    def observe(self, view: FleetView) -> None:
        last, self._last = self._last, view
        if last is None or view.at <= last.at:
            return
        dt = view.at - last.at
        before, after = last.owner(), view.owner()
        done: dict[str, int] = {}
        busy: dict[str, bool] = {}
        for p, worker in after.items():
            if before.get(p) != worker:
                continue  # moved in between: count neither side
            done[worker] = done.get(worker, 0) + max(
                0, view.committed.get(p, 0) - last.committed.get(p, 0))
            busy[worker] = busy.get(worker, False) or (
                last.backlog(p) > 0 and view.backlog(p) > 0)
        decay = 0.5 ** (dt / self.halflife_s) if self.halflife_s > 0 else 0.0
        for worker, count in done.items():
            if worker not in self._producing:
                if count:
                    self._producing.add(worker)  # its first results: count from now
                continue
            if not busy.get(worker) and count == 0:
                continue  # idle: says nothing about capacity
            records, seconds = self._sums.get(worker, (0.0, 0.0))
            self._sums[worker] = (records * decay + count, seconds * decay + dt)

    @property
    def rates(self) -> dict[str, float]:
        """Measured workers only."""
        return {w: records / seconds for w, (records, seconds) in self._sums.items()
                if seconds >= self.min_measured_s}

    def rate(self, worker: str) -> float | None:
        return self.rates.get(worker)

    def rates_for(self, workers: Iterable[str]) -> dict[str, float]:
        """Every worker's rate, the median standing in for the unmeasured;
        an empty dict until anyone is measured."""
        measured = self.rates
        known = sorted(r for r in measured.values() if r > 0)
        if not known:
            return {}
        median = known[len(known) // 2]
        return {w: measured.get(w) or median for w in workers}


# -- the decision -----------------------------------------------------------------

def eta(backlog: float, rate: float) -> float:
    return backlog / rate if rate > 0 else (0.0 if backlog == 0 else math.inf)


def decide(view: FleetView, rates: Mapping[str, float], me: str, *,
           my_latency_s: float, settled: bool = True, params: Params = Params()) -> Decision:
    """What worker `me` does with its own slots, given the fleet. `settled`:
    the set of workers has not changed for a while (at start, the fleet is
    still joining: a worker that opened its fair share of one would take
    partitions its late peers need)."""
    mine = [m for m in view.members if m.worker == me]
    standbys = [m for m in mine if not m.partitions]
    total = view.total_backlog()
    # 1. fewer members than partitions: open slots up to this worker's fair
    # share of the partitions (by rate; equal until measured), so that the
    # assignor ends with one partition per member, spread by capacity. Also
    # while the group rebalances: at start it rebalances all the time.
    if mine and settled and len(view.members) < view.partitions:
        want = min(fair_share(view, rates, me), params.max_slots)
        if len(mine) < want:
            return Decision(open=min(want - len(mine), params.max_open_per_round),
                            why=f"towards {want} slots, one partition each")
    if not view.stable:
        return Decision(why="group rebalancing")
    if total == 0 or not rates or me not in rates:
        return _unmeasured(mine, standbys, total)
    workers = view.workers() | {me}
    fleet_rate = sum(rates.get(w, 0.0) for w in workers)
    fleet_eta = eta(total, fleet_rate)
    slack = max(params.min_slack_s, params.slack_share * fleet_eta)
    etas = {w: eta(view.worker_backlog(w), rates.get(w, 0.0)) for w in workers}
    # 2. demand: one standby (kept while it holds) when this worker is ahead
    # of the fleet and taking a partition from the worker furthest behind
    # would save that worker at least the slack. Only a worker that gains
    # the fleet time asks: a standby of a slow GPU would compete with a fast
    # one's for the partition freed (two slow GPUs would trade partitions).
    behind = max((w for w in workers if w != me), key=lambda w: (etas[w], w), default=None)
    # best_move scales the donor's latency to the receiver's; here this
    # worker is the receiver and knows its own.
    gain = None if behind is None or not rates.get(behind) else best_move(
        view, rates, behind, me, my_latency_s * rates[me] / rates[behind])
    ahead = etas[me] < fleet_eta and gain is not None and gain[1] >= slack
    if not mine:
        return Decision(open=1, why="rejoin as a standby") if ahead else Decision()
    if ahead and not standbys and len(mine) < params.max_slots:
        assert behind is not None
        return Decision(open=1, why=f"ahead of the fleet (eta {etas[me]:.0f}s vs "
                                    f"{etas[behind]:.0f}s for {behind})")
    if standbys and not ahead:
        return Decision(close=tuple(m.slot for m in standbys), why="caught up with the fleet")
    if len(standbys) > 1:
        return Decision(close=tuple(m.slot for m in standbys[1:]), why="one standby is enough")
    return _donate(view, rates, me, etas, fleet_eta + slack, slack, my_latency_s)


def _unmeasured(mine: list[Member], standbys: list[Member], total: int) -> Decision:
    """No work left, or no rates to compare yet."""
    if not mine and total:
        # It gave its last partition away: back into the group as a standby.
        return Decision(open=1, why="rejoin as a standby")
    if standbys and total == 0:
        return Decision(close=tuple(m.slot for m in standbys), why="no work left")
    return Decision(why="no rates yet" if total else "no work left")


def _donate(view: FleetView, rates: Mapping[str, float], me: str, etas: Mapping[str, float],
            late_eta: float, slack: float, my_latency_s: float) -> Decision:
    """3. donate: the workers furthest behind (ETA above `late_eta`) hand one
    partition to each waiting standby (the assignor gives each freed
    partition to a member without one, so more partitions than standbys
    would pile up)."""
    receivers = sorted({m.worker for m in view.members if not m.partitions},
                       key=lambda w: (etas[w], w))
    donors = sorted((w for w in etas if etas[w] > late_eta and w not in receivers),
                    key=lambda w: (-etas[w], w))[:len(receivers)]
    if me not in donors:
        return Decision()
    # Receivers are dealt to donors in turn: a single slow GPU serves every
    # waiting standby in one round instead of one per round.
    my_receivers = [r for i, r in enumerate(receivers) if donors[i % len(donors)] == me]
    closes: list[str] = []
    gains: list[str] = []
    moved = 0
    for receiver in my_receivers:
        move = best_move(view, rates, me, receiver, my_latency_s, exclude=closes, moved=moved)
        if move is None or move[1] < slack:
            continue
        closes.append(move[0])
        moved += view.worker_backlog_of_slot(move[0])
        gains.append(f"{receiver} (saves {move[1]:.0f}s)")
    if not closes:
        return Decision()
    return Decision(close=tuple(closes), why="hand a partition to " + ", ".join(gains))


def initial_slots(partitions: int, gpus: int | None, max_slots: int = Params().max_slots) -> int:
    """Members a worker opens at start: its share of the fleet the run was
    planned for. When the fleet starts together, the assignor's first
    answer is then one partition per member, shared equally, and no slot
    has to split later (a split moves partitions across workers and wastes
    their requests in flight). Unknown fleet: one member, split later."""
    if not gpus:
        return 1
    return max(1, min(max_slots, math.ceil(partitions / gpus)))


def fair_share(view: FleetView, rates: Mapping[str, float], me: str) -> int:
    """Partitions worker `me` should own, rounded up: its share of the
    fleet's rate (equal shares until rates are measured)."""
    workers = view.workers() | {me}
    total = sum(rates.get(w, 0.0) for w in workers)
    share = rates.get(me, 0.0) / total if total > 0 and me in rates else 1 / len(workers)
    return max(1, math.ceil(view.partitions * share))


def best_move(view: FleetView, rates: Mapping[str, float], donor: str, receiver: str,
              donor_latency_s: float, *, exclude: Iterable[str] = (), moved: int = 0
              ) -> tuple[str, float] | None:
    """The donor's single-partition slot whose move to the receiver shortens
    the later of the two ETAs the most, and by how many seconds. Moving
    costs the receiver the requests it must redo: about one request latency
    there (the donor's latency, scaled by the two rates). `exclude`: slots
    already given away this round, `moved` records with them."""
    r_donor, r_receiver = rates[donor], rates[receiver]
    donor_backlog = view.worker_backlog(donor) - moved
    excluded = set(exclude)
    receiver_backlog = view.worker_backlog(receiver)
    before = max(eta(donor_backlog, r_donor), eta(receiver_backlog, r_receiver))
    redo_s = donor_latency_s * (r_donor / r_receiver if r_receiver > 0 else 1.0)
    best: tuple[str, float] | None = None
    for member in view.members:
        if member.worker != donor or len(member.partitions) != 1 or member.slot in excluded:
            continue
        b = view.backlog(member.partitions[0])
        if b == 0:
            continue
        after = max(eta(donor_backlog - b, r_donor),
                    eta(receiver_backlog + b, r_receiver) + redo_s)
        gain = before - after
        if best is None or gain > best[1]:
            best = (member.slot, gain)
    return best
