"""Which run's result each prompt of a lineage takes, from dead letters alone.

The dataset of a lineage holds, for every prompt id of its root, the accepted
result of the newest run that has one. Every run of a lineage puts each of
its prompts in exactly one place (an S3 line or a DLQ record), and a run's
prompts follow from its parent's: the root's are all of them, a replay's are
its parent's, a redrive's are its parent's dead letters with the redriven
reasons. So the dead letters (prompt id and reason, read from the DLQ topics)
decide every prompt's fate without reading a byte of S3:

- a prompt in no DLQ is accepted by every run that holds it: the root and the
  replays before the first redrive (the "clean" prompts, counted, not stored);
- a prompt in some DLQ is tracked by id, with one state per run: accepted,
  rejected (the reason), absent, or open (the run is not finished, so it is
  either accepted already or not yet persisted).

Only the open states make a count uncertain; `coverage` gives exact bounds
for them from the sink's committed S3 line counts. Pure: the I/O shell feeds
it (`ops/dataset/sources.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from schemas.run import DLQ_REASONS, RunKind

ACCEPTED = "+"
OPEN = "?"
ABSENT = "-"
UNKNOWN_REASON = "x"
REASON_CODES: dict[str, str] = {"failed": "f", "length": "l", "empty": "e", "trivial": "t",
                                "missing_reasoning": "m"}
REASONS: dict[str, str] = {code: reason for reason, code in REASON_CODES.items()}
REASONS[UNKNOWN_REASON] = "unknown"
assert set(REASON_CODES) == DLQ_REASONS
PENDING = "pending"  # the last word on a prompt of an unfinished run


@dataclass(frozen=True)
class RunFacts:
    """What the index needs to know of one run of the lineage."""

    run_id: str
    kind: RunKind
    reasons: frozenset[str] = frozenset()  # a redrive's
    complete: bool = True  # every published prompt persisted (S3 or DLQ)
    prompts: int = 0  # prompts the run publishes (producer checkpoint total)
    accepted: int = 0  # S3 lines the sinks committed


@dataclass
class RunTally:
    """One run's part in the dataset."""

    run_id: str
    holds: int = 0  # prompts of the root this run holds (its own prompts)
    winners: int = 0  # accepted results that are the dataset's (no newer run has one)
    rejected: Counter[str] = field(default_factory=Counter)  # dead letters by reason
    open: int = 0  # held, not rejected, run unfinished: accepted or not yet persisted


@dataclass
class DatasetSummary:
    prompts: int  # the root's prompt ids: the dataset's size if complete
    runs: list[RunTally]
    covered_low: int  # prompts with an accepted result, at least ...
    covered_high: int  # ... and at most (equal when no run is unfinished)
    # Prompts without an accepted result (or not yet known to have one), by
    # the newest run holding them and what it said: a reason, or "pending".
    without: Counter[tuple[str, str]]
    samples: dict[tuple[str, str], list[str]]  # a few ids for each
    anomalies: Counter[str]

    @property
    def exact(self) -> bool:
        return self.covered_low == self.covered_high


class LineageIndex:
    """Feed each run's dead letters in lineage order (root first) with
    `add_run`; then `summary()`, and `winner(prompt_id)` for the export."""

    def __init__(self, runs: Sequence[RunFacts], samples_per_group: int = 5) -> None:
        if not runs:
            raise ValueError("a lineage has at least one run")
        if runs[0].kind != "produce" or any(r.kind == "produce" for r in runs[1:]):
            raise ValueError("a lineage is a produced run followed by replays and redrives")
        self.runs = list(runs)
        self._states: dict[str, str] = {}  # tracked prompt id -> one code per run added
        self._added = 0
        self._rejected: list[Counter[str]] = []
        self._samples = samples_per_group
        self.anomalies: Counter[str] = Counter()

    # -- building ----------------------------------------------------------------

    def add_run(self, dead_letters: Iterable[tuple[str, str]]) -> None:
        """The (prompt id, reason) of every dead letter of the next run."""
        k = self._added
        if k >= len(self.runs):
            raise ValueError("every run of the lineage is added already")
        run = self.runs[k]
        found: dict[str, str] = {}
        rejected: Counter[str] = Counter()
        for pid, reason in dead_letters:
            code = REASON_CODES.get(reason, UNKNOWN_REASON)
            if pid in found:
                self.anomalies[f"{run.run_id}: a prompt in the DLQ twice"] += 1
                continue
            found[pid] = code
            rejected[REASONS[code]] += 1
        held = ACCEPTED if run.complete else OPEN
        states = self._states
        for pid, past in states.items():
            letter = found.pop(pid, None)
            member = self._member(k, past)
            if letter is not None:
                if not member:
                    self.anomalies[f"{run.run_id}: a dead letter for a prompt the run does "
                                   "not hold"] += 1
                states[pid] = past + letter
            else:
                states[pid] = past + (held if member else ABSENT)
        if found:
            if not self._clean_member(k):
                self.anomalies[f"{run.run_id}: a dead letter for a prompt the run does not "
                               "hold"] += len(found)
            history = "".join(self._clean_state(j) for j in range(k))
            for pid, code in found.items():
                states[pid] = history + code
        self._rejected.append(rejected)
        self._added += 1

    def _member(self, k: int, past: str) -> bool:
        """Does run k hold a tracked prompt with these states in runs < k?"""
        kind = self.runs[k].kind
        if kind == "produce":
            return True
        if kind == "replay":
            return past[k - 1] != ABSENT
        return REASONS.get(past[k - 1]) in self.runs[k].reasons

    def _clean_member(self, k: int) -> bool:
        """Does run k hold the prompts no DLQ names? Up to the first redrive."""
        return all(r.kind != "redrive" for r in self.runs[1:k + 1])

    def _clean_state(self, j: int) -> str:
        if not self._clean_member(j):
            return ABSENT
        return ACCEPTED if self.runs[j].complete else OPEN

    def _check_done(self) -> None:
        if self._added != len(self.runs):
            raise ValueError(f"{len(self.runs) - self._added} run(s) of the lineage not added")

    # -- reading -------------------------------------------------------------------

    @property
    def clean(self) -> int:
        """Prompts of the root no DLQ of the lineage names."""
        return max(0, self.runs[0].prompts - len(self._states))

    def clean_winner(self) -> int | None:
        """Index of the run whose result a clean prompt takes."""
        self._check_done()
        won = [j for j in range(len(self.runs)) if self._clean_state(j) == ACCEPTED]
        return won[-1] if won else None

    def winner(self, prompt_id: str, clean_winner: int | None) -> int | None:
        """Index of the run whose accepted result the dataset takes for this
        prompt (None: no run has one); `clean_winner` from `clean_winner()`."""
        states = self._states.get(prompt_id)
        if states is None:
            return clean_winner
        j = states.rfind(ACCEPTED)
        return j if j >= 0 else None

    def last_holder(self, prompt_id: str) -> int | None:
        """Index of the newest run holding a prompt some DLQ names (None:
        no DLQ names it): the run whose word on it is the last."""
        states = self._states.get(prompt_id)
        if states is None:
            return None
        return max(j for j, code in enumerate(states) if code != ABSENT)

    def summary(self) -> DatasetSummary:
        self._check_done()
        n = len(self.runs)
        outcomes = _Outcomes(self.runs, self._samples,
                             [RunTally(r.run_id, rejected=self._rejected[j])
                              for j, r in enumerate(self.runs)])
        clean = self.clean
        if clean:
            outcomes.add("".join(self._clean_state(j) for j in range(n)), clean, None)
        for pid, states in self._states.items():
            outcomes.add(states, 1, pid)
        low, high = outcomes.open_bounds()
        return DatasetSummary(
            prompts=self.runs[0].prompts, runs=outcomes.tallies,
            covered_low=outcomes.definite + low, covered_high=outcomes.definite + high,
            without=outcomes.without, samples=outcomes.samples,
            anomalies=_count_anomalies(self.runs, outcomes.tallies, self.anomalies))


@dataclass
class _Outcomes:
    """What `summary` counts, one history of states (one code per run) at a
    time: a history stands for `count` prompts (the clean ones share one)."""

    runs: list[RunFacts]
    samples_per_group: int
    tallies: list[RunTally]
    definite: int = 0  # prompts some run accepted for sure
    candidates: int = 0  # prompts without a sure acceptance, open somewhere
    without: Counter[tuple[str, str]] = field(default_factory=Counter)
    samples: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    # Per run: its open prompts accepted by another run for sure, and the rest.
    open_covered: list[int] = field(init=False)
    open_uncovered: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.open_covered = [0] * len(self.runs)
        self.open_uncovered = [0] * len(self.runs)

    def add(self, states: str, count: int, pid: str | None) -> None:
        for j, code in enumerate(states):
            if code != ABSENT:
                self.tallies[j].holds += count
            if code == OPEN:
                self.tallies[j].open += count
        won = states.rfind(ACCEPTED)
        if won >= 0:
            self.definite += count
            self.tallies[won].winners += count
            self._add_open(self.open_covered, states, count)
            return
        if OPEN in states:
            self.candidates += count
            self._add_open(self.open_uncovered, states, count)
        self._add_without(states, count, pid)

    @staticmethod
    def _add_open(per_run: list[int], states: str, count: int) -> None:
        for j, code in enumerate(states):
            if code == OPEN:
                per_run[j] += count

    def _add_without(self, states: str, count: int, pid: str | None) -> None:
        """Grouped by the newest run holding the prompts and what it said."""
        last = max(j for j, code in enumerate(states) if code != ABSENT)
        code = states[last]
        group = (self.runs[last].run_id, PENDING if code == OPEN else REASONS[code])
        self.without[group] += count
        if pid is None:  # the clean prompts: no ids to show
            return
        kept = self.samples.setdefault(group, [])
        if len(kept) < self.samples_per_group:
            kept.append(pid)

    def open_bounds(self) -> tuple[int, int]:
        """How many of the candidates are accepted, at least and at most."""
        low = highs = 0
        for j, run in enumerate(self.runs):
            if run.complete:
                continue
            # Of run j's open prompts, `accepted` are in S3 already; those
            # accepted elsewhere for sure add nothing.
            low = max(low, min(self.open_uncovered[j],
                               max(0, run.accepted - self.open_covered[j])))
            highs += min(run.accepted, self.open_uncovered[j])
        return low, min(self.candidates, highs)


def _count_anomalies(runs: list[RunFacts], tallies: list[RunTally],
                     found: Counter[str]) -> Counter[str]:
    """The anomalies found while adding, and runs whose producer published
    another number of prompts than their parent's outcomes give them."""
    anomalies = Counter(found)
    for run, tally in zip(runs, tallies, strict=True):
        if run.prompts and tally.holds != run.prompts:
            anomalies[f"{run.run_id}: publishes {run.prompts:,} prompts, its parent's "
                      f"outcomes give {tally.holds:,}"] += 1
    return anomalies
