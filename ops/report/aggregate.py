"""Records in, figure data out, one record at a time (pure, no I/O).

A report reads a whole lineage (a million results and more), so nothing is
kept per record: every figure is a counter or a fixed-bin histogram, and
the results are decoded into slim Structs that skip the prompt's messages
and the answer's text (only whether reasoning is present is kept).
`Aggregator` takes S3 lines and dead letters; `TimelineBuilder` takes the
progress records.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

import msgspec

from ops.report.figures import (
    Breakdown,
    Figures,
    GpuAccept,
    Histogram,
    LengthRow,
    Series,
    Timeline,
)
from schemas.progress import ConsumerProgress, ProducerCheckpoint, Progress

LENGTH_BINS = 32
ACCEPT_BIN = 0.25  # accept length histogram: bins of a quarter token ...
ACCEPT_BINS = 32  # ... from 0 to 8 (longer in the last bin)
COUNT_BINS = 20  # turns and tool rounds: 0..19, 20 and more in the last bin
TOP_SOURCES = 12
NO_PROMPT = "(no prompt)"  # dead letters of records that were not prompts (`invalid`)


# -- the slim view of a record -------------------------------------------------


class _Prompt(msgspec.Struct):
    category: str = ""
    source: str = ""


class _Usage(msgspec.Struct):
    completion_tokens: int = 0
    reasoning_tokens: int = 0


class _Spec(msgspec.Struct):
    accept_length: float | None = None


class _Answer(msgspec.Struct):
    """What a Completion and a conversation's Step have in common."""

    finish_reason: str = ""
    reasoning_content: str | None = None
    tool_calls: list[msgspec.Raw] | None = None
    usage: _Usage = msgspec.field(default_factory=_Usage)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class _Step(_Answer):
    turn: int = 0


class _Turn(msgspec.Struct):
    reasoning_content: str | None = None


class _Line(msgspec.Struct):
    """An S3 line: a `schemas.TrainingSample`, or (`kind` "conversation") a
    `schemas.sample.ConversationSample`."""

    kind: str = "completion"
    category: str = ""
    source: str = ""
    finish_reason: str = ""
    completion: _Turn = msgspec.field(default_factory=_Turn)
    usage: _Usage = msgspec.field(default_factory=_Usage)
    spec: _Spec = msgspec.field(default_factory=_Spec)
    steps: list[_Step] = []
    outcome: str = "finished"


class _Completion(_Answer, tag="completion", tag_field="kind"):
    prompt: _Prompt = msgspec.field(default_factory=_Prompt)


class _Conversation(msgspec.Struct, tag="conversation", tag_field="kind"):
    prompt: _Prompt = msgspec.field(default_factory=_Prompt)
    steps: list[_Step] = []
    outcome: str = "finished"


class _Failure(msgspec.Struct, tag="failure", tag_field="kind"):
    prompt: _Prompt | None = None
    failure: str = ""


_Record = _Completion | _Conversation | _Failure


class _DeadLetter(msgspec.Struct):
    """A `schemas.DeadLetter`: the completion record as the worker wrote it."""

    reason: str
    record: _Record | None = None


_line_decoder = msgspec.json.Decoder(_Line)
_letter_decoder = msgspec.json.Decoder(_DeadLetter)


# -- small pure helpers --------------------------------------------------------


def bin_index(value: float, width: float, bins: int) -> int:
    """The bin of a value: [0, width) is bin 0; below 0 in the first, past
    the end in the last."""
    return min(max(int(value // width), 0), bins - 1)


def length_width(caps: Sequence[int], bins: int = LENGTH_BINS) -> int:
    """Bin width in tokens: the largest cap falls in the last bin."""
    top = max([c for c in caps if c > 0], default=bins)
    return max(1, math.ceil((top + 1) / bins))


def _present(reasoning: str | None, usage: _Usage) -> bool:
    """Thinking is present: reasoning text that is not blank, or reasoning tokens."""
    return bool(reasoning and not reasoning.isspace()) or usage.reasoning_tokens > 0


def histogram(counts: Sequence[int], width: float) -> Histogram:
    return Histogram(edges=[round(i * width, 6) for i in range(len(counts) + 1)],
                     counts=list(counts))


def breakdown(by: str, table: dict[str, Counter[str]], limit: int | None = None) -> Breakdown:
    """Rows most first (then by name); past `limit` rows, the rest summed in one."""
    keys = sorted({k for row in table.values() for k in row},
                  key=lambda k: (-sum(row[k] for row in table.values()), k))
    ordered = sorted(table.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    rows = [(name, dict(row)) for name, row in ordered]
    if limit is not None and len(rows) > limit:
        rest: Counter[str] = Counter()
        for _, row in ordered[limit - 1:]:
            rest.update(row)
        rows = rows[:limit - 1] + [(f"(other {len(ordered) - limit + 1} {by}s)", dict(rest))]
    return Breakdown(by=by, keys=keys, rows=rows)


# -- the aggregator ------------------------------------------------------------


class Aggregator:
    """Feed accepted S3 lines (`add_line`) and dead letters (`add_dead_letter`)
    in any order; `figures()` at any time."""

    def __init__(self, max_tokens: Sequence[int]) -> None:
        self.max_tokens = sorted(set(max_tokens))
        self.width = length_width(self.max_tokens)
        self.accepted = 0
        self.dead_letters = 0
        self.lengths: dict[str, list[int]] = {}
        self.answers: Counter[str] = Counter()
        self.truncated: Counter[str] = Counter()
        self.finish_cat: dict[str, Counter[str]] = defaultdict(Counter)
        self.finish_src: dict[str, Counter[str]] = defaultdict(Counter)
        self.dlq_cat: dict[str, Counter[str]] = defaultdict(Counter)
        self.dlq_src: dict[str, Counter[str]] = defaultdict(Counter)
        self.thinking: dict[str, Counter[str]] = defaultdict(Counter)
        self.accept = [0] * ACCEPT_BINS
        self.conversations = 0
        self.turns = [0] * COUNT_BINS
        self.tool_rounds = [0] * COUNT_BINS

    @property
    def records(self) -> int:
        return self.accepted + self.dead_letters

    def add_line(self, line: bytes) -> None:
        """One line of a sink's S3 object: an accepted result."""
        self.accepted += 1
        sample = _line_decoder.decode(line)
        prompt = _Prompt(sample.category, sample.source)
        if sample.kind == "conversation":
            self._conversation(prompt, sample.steps, sample.outcome)
            return
        self._finish(prompt, sample.finish_reason)
        self._answer(prompt.category, sample.finish_reason, sample.usage, sample.spec,
                     _present(sample.completion.reasoning_content, sample.usage))

    def add_dead_letter(self, value: bytes) -> None:
        """One record of a DLQ topic (`schemas.DeadLetter`)."""
        letter = _letter_decoder.decode(value)
        self.dead_letters += 1
        record = letter.record
        prompt = record.prompt if record is not None else None
        category, source = (prompt.category, prompt.source) if prompt else (NO_PROMPT, NO_PROMPT)
        self.dlq_cat[category][letter.reason] += 1
        self.dlq_src[source][letter.reason] += 1
        if record is not None:
            self._add(record)

    def _add(self, record: _Record) -> None:
        if isinstance(record, _Failure):
            prompt = record.prompt or _Prompt(NO_PROMPT, NO_PROMPT)
            self._finish(prompt, f"failed: {record.failure}")
            return
        prompt = record.prompt
        if isinstance(record, _Completion):
            self._finish(prompt, record.finish_reason)
            self._step(prompt.category, record)
            return
        self._conversation(prompt, record.steps, record.outcome)

    def _conversation(self, prompt: _Prompt, steps: list[_Step], outcome: str) -> None:
        self.conversations += 1
        self._finish(prompt, f"conversation {outcome}")
        turns = {step.turn for step in steps}
        self.turns[min(len(turns), COUNT_BINS - 1)] += 1
        rounds = sum(1 for step in steps if step.tool_calls)
        self.tool_rounds[min(rounds, COUNT_BINS - 1)] += 1
        for step in steps:
            self._step(prompt.category, step)

    def _step(self, category: str, answer: _Answer) -> None:
        self._answer(category, answer.finish_reason, answer.usage, answer.spec,
                     _present(answer.reasoning_content, answer.usage))

    def _finish(self, prompt: _Prompt, reason: str) -> None:
        self.finish_cat[prompt.category][reason] += 1
        self.finish_src[prompt.source][reason] += 1

    def _answer(self, category: str, finish_reason: str, usage: _Usage, spec: _Spec,
                thinking: bool) -> None:
        row = self.lengths.get(category)
        if row is None:
            row = self.lengths[category] = [0] * LENGTH_BINS
        row[bin_index(usage.completion_tokens, self.width, LENGTH_BINS)] += 1
        self.answers[category] += 1
        if finish_reason == "length":
            self.truncated[category] += 1
        self.thinking[category]["present" if thinking else "absent"] += 1
        if spec.accept_length is not None:
            self.accept[bin_index(spec.accept_length, ACCEPT_BIN, ACCEPT_BINS)] += 1

    def figures(self, title: str, runs: list[str], timeline: Timeline,
                accept_by_gpu: Sequence[GpuAccept] = (), notes: Sequence[str] = ()) -> Figures:
        categories = sorted(self.lengths, key=lambda c: (-self.answers[c], c))
        return Figures(
            title=title, runs=runs, max_tokens=self.max_tokens, records=self.records,
            accepted=self.accepted, dead_letters=self.dead_letters,
            lengths=[LengthRow(c, self.answers[c], self.truncated[c],
                               histogram(self.lengths[c], self.width)) for c in categories],
            finish_by_category=breakdown("category", self.finish_cat),
            finish_by_source=breakdown("source", self.finish_src, TOP_SOURCES),
            dlq_by_category=breakdown("category", self.dlq_cat),
            dlq_by_source=breakdown("source", self.dlq_src, TOP_SOURCES),
            thinking=breakdown("category", self.thinking),
            accept_lengths=histogram(self.accept, ACCEPT_BIN) if any(self.accept) else None,
            accept_by_gpu=list(accept_by_gpu),
            timeline=timeline, conversations=self.conversations,
            turns=histogram(self.turns, 1) if self.conversations else None,
            tool_rounds=histogram(self.tool_rounds, 1) if self.conversations else None,
            notes=list(notes))


# -- the timeline --------------------------------------------------------------

MAX_POINTS = 400  # per series: older points are thinned as more come


class _Thinned:
    """(t, value) points at least `gap` seconds apart; the gap doubles (and
    every other point goes) whenever MAX_POINTS are kept."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []
        self.gap = 0.0

    def add(self, t: float, value: float) -> None:
        if len(self.points) > 1 and t - self.points[-2][0] < self.gap:
            self.points[-1] = (t, value)  # the newest point stands until the gap is passed
            return
        self.points.append((t, value))
        if len(self.points) > MAX_POINTS:
            self.points = self.points[::2]
            span = self.points[-1][0] - self.points[0][0]
            self.gap = max(self.gap * 2, span / MAX_POINTS)


class TimelineBuilder:
    """Feed each run's progress records in the order they were committed
    (`add`); the counters are cumulative, so a rate is a difference of two."""

    def __init__(self) -> None:
        self.gpus: dict[tuple[str, str], _Thinned] = {}  # (run, instance) -> output tokens
        self.done: dict[tuple[str, str], _Thinned] = {}  # (run, instance) -> answers
        self.latest: dict[tuple[str, str], ConsumerProgress] = {}
        self.started: dict[str, float] = {}
        self.plans: dict[str, float] = {}  # run -> requests/s predicted
        self.totals: dict[str, int] = {}
        self.snapshots = 0

    def add_plan(self, run: str, requests_per_s: float | None) -> None:
        if requests_per_s:
            self.plans[run] = requests_per_s

    def add(self, run: str, record: Progress) -> None:
        self.snapshots += 1
        if isinstance(record, ProducerCheckpoint):
            self.totals[run] = max(self.totals.get(run, 0), record.total)
            return
        if not isinstance(record, ConsumerProgress) or not record.updated_at:
            return
        key = (run, record.instance)
        self.latest[key] = record
        if record.started_at:
            self.started[run] = min(self.started.get(run, record.started_at), record.started_at)
        self.gpus.setdefault(key, _Thinned()).add(record.updated_at, record.completion_tokens)
        self.done.setdefault(key, _Thinned()).add(record.updated_at,
                                                  record.completions + record.failures)

    def _name(self, run: str, instance: str) -> str:
        return f"{run}/{instance}" if len({r for r, _ in self.gpus}) > 1 else instance

    def accept_by_gpu(self) -> list[GpuAccept]:
        """Each worker's accept length, weighted by output tokens (its last counters)."""
        return [GpuAccept(self._name(run, instance), p.spec_tokens,
                          p.spec_accept_weighted / p.spec_tokens)
                for (run, instance), p in sorted(self.latest.items()) if p.spec_tokens]

    def timeline(self) -> Timeline:
        runs = sorted({run for run, _ in self.gpus})
        t0 = min((self.started.get(run, math.inf) for run in runs), default=0.0)
        if t0 == math.inf:
            t0 = min(p.points[0][0] for p in self.gpus.values())
        throughput = []
        for (run, instance), thinned in sorted(self.gpus.items()):
            pts = thinned.points
            rates = [(b[0] - t0, (b[1] - a[1]) / (b[0] - a[0]))
                     for a, b in zip(pts, pts[1:]) if b[0] > a[0]]
            throughput.append(Series(self._name(run, instance), rates))
        progress = []
        for run in runs:
            actual = _summed([self.done[k].points for k in self.done if k[0] == run])
            start = self.started.get(run, actual[0][0] if actual else t0)
            progress.append(Series(f"{run} generated", [(t - t0, v) for t, v in actual]))
            rate = self.plans.get(run)
            total = self.totals.get(run, 0)
            if rate and total:
                progress.append(Series(f"{run} plan", [(start - t0, 0.0),
                                                       (start - t0 + total / rate,
                                                        float(total))]))
        return Timeline(throughput=throughput, progress=progress, snapshots=self.snapshots,
                        planned=any(s.name.endswith(" plan") for s in progress))


def _summed(per_instance: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The sum over instances of each one's latest value, at every point's time."""
    events = sorted((t, i, v) for i, pts in enumerate(per_instance) for t, v in pts)
    latest = [0.0] * len(per_instance)
    out: list[tuple[float, float]] = []
    for t, i, v in events:
        latest[i] = v
        total = sum(latest)
        if out and out[-1][0] == t:
            out[-1] = (t, total)
        else:
            out.append((t, total))
    return out
