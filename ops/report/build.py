"""Where a report's records come from (the I/O shell around aggregate.py):
each run's S3 objects, its DLQ topic and the history of its progress topic.

One run: every result it persisted, accepted or dead-lettered, so a run in
progress can be looked at. A lineage (replays, redrives): each prompt of the
root once, as the dataset has it - the accepted result of the newest run
that has one, else its last dead letter; every run must be finished, as for
`export`. Records stream through; memory holds the lineage's dead-letter
index and the aggregator's counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from botocore.exceptions import ClientError

from ops.dataset.index import LineageIndex
from ops.dataset.lineage import LineageError
from ops.dataset.sources import Lineage, build_index, load_lineage, s3_location
from ops.export import source
from ops.export.command import sample_id
from ops.report import figures, render
from ops.report.aggregate import Aggregator, TimelineBuilder
from ops.report.figures import Figures, Timeline
from schemas.progress import decode_progress
from sink.s3_writer import make_client
from tokenmill.kafka import committed, topics
from tokenmill.log import get_logger
from tokenmill.progress import RunProgress
from tokenmill.settings import Settings

log = get_logger("tokenmill.report")

PAGE = "report.html"
DATA = "report.json"


class ReportRefused(LineageError):
    """A lineage with a run in progress: its dataset would still move."""


def _values(settings: Settings, topic: str) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every committed record; nothing if the topic does not exist."""
    try:
        for message in committed.read_topic(settings, topic):
            yield message.key() or b"", message.value() or b""
    except LookupError:
        return


# An export's directory is the same bytes every time; the progress topic's
# history is not (compaction drops it), so an export's report leaves it out.
LEFT_OUT = ("Left out of an export's report, which is the same bytes every time while the "
            "progress history is compacted away: `tokenmill report RUN` shows it.")


def build_figures(settings: Settings, run_id: str, found: Lineage | None = None,
                  index: LineageIndex | None = None, history: bool = True) -> Figures:
    """`found` and `index`: the lineage's, when the caller has them (export);
    `history`: read the progress topics' history for the timeline."""
    found = found or load_lineage(settings, run_id)
    single = len(found.specs) == 1
    if index is None and not single:
        busy = [f.run_id for f in found.facts if not f.complete]
        if busy:
            raise ReportRefused(f"run(s) of the lineage still in progress: {', '.join(busy)}; "
                                f"report on one run of it (e.g. `tokenmill report {busy[0]}`) "
                                "or once every run is finished")
        index = build_index(settings, found)
    agg = Aggregator([spec.generation.max_tokens for spec in found.specs])
    missing = _read_results(settings, found, index, agg)
    timeline = TimelineBuilder()
    for spec, state in zip(found.specs, found.progress):
        timeline.add_plan(spec.run_id, spec.estimate.requests_per_s if spec.estimate else None)
        if history:
            _read_progress(settings, spec.run_id, timeline)
        else:  # each worker's last counters: what accept_by_gpu needs
            for record in state.consumers.values():
                timeline.add(spec.run_id, record)
    notes = missing + [_in_progress(f.run_id, p) for f, p in zip(found.facts, found.progress)
                       if not f.complete]
    if not single:
        notes.append("a lineage: each prompt of the root once, its accepted result from the "
                     "newest run that has one, else its last dead letter")
    title = (f"tokenmill report: {run_id}" if single else
             f"tokenmill report: lineage of {run_id} (root {found.specs[0].run_id})")
    drawn = (timeline.timeline() if history else
             Timeline(throughput=[], progress=[], snapshots=0, planned=False, left_out=LEFT_OUT))
    return agg.figures(title, [s.run_id for s in found.specs], drawn, timeline.accept_by_gpu(),
                       notes)


def _in_progress(run_id: str, state: RunProgress) -> str:
    if not state.published:
        return f"run {run_id} has published no prompt yet"
    return (f"run {run_id} is in progress: {state.persisted:,} of {state.published:,} "
            "published prompts persisted so far")


def _read_results(settings: Settings, found: Lineage, index: LineageIndex | None,
                  agg: Aggregator) -> list[str]:
    """Every run's results into `agg`; what could not be read, as notes."""
    client = make_client(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region)
    missing = []
    for j, spec in enumerate(found.specs):
        bucket, prefix = s3_location(settings, spec)
        try:
            keys = source.object_keys(client, bucket, prefix, spec.run_id)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
                raise
            keys = []  # no sink has written yet: the run has no accepted result
            missing.append(f"run {spec.run_id}: bucket {bucket} does not exist (no sink has "
                           "written to it yet), so no accepted results were read")
        feed(agg, index, j, source.lines(client, bucket, keys),
             _values(settings, topics.dlq_topic(spec.run_id)))
    return missing


def feed(agg: Aggregator, index: LineageIndex | None, j: int, lines: Iterable[bytes],
         letters: Iterable[tuple[bytes, bytes]]) -> None:
    """Run j's S3 lines and (key, value) dead letters into the aggregator: all
    of them for one run (no index), else those that are the dataset's word."""
    clean = index.clean_winner() if index else None
    for line in lines:
        if index is None or index.winner(sample_id(line), clean) == j:
            agg.add_line(line)
    for key, value in letters:
        if index is None or _last_word(index, key.decode(), clean) == j:
            agg.add_dead_letter(value)


def _last_word(index: LineageIndex, prompt_id: str, clean: int | None) -> int | None:
    """The run whose dead letter is the prompt's last word (None: it has a result)."""
    if index.winner(prompt_id, clean) is not None:
        return None
    return index.last_holder(prompt_id)


def _read_progress(settings: Settings, run_id: str, timeline: TimelineBuilder) -> None:
    """Every committed progress record still in the topic: compaction keeps
    each member's latest, and the history of the last minutes before it."""
    for _, value in _values(settings, topics.progress_topic(run_id)):
        timeline.add(run_id, decode_progress(value))


def write_report(write: Callable[[str, bytes], None], found: Figures) -> None:
    """The page and its numbers, by name (a directory, or an export's destination)."""
    write(PAGE, render.render(found).encode())
    write(DATA, figures.encode(found))


class WriteFile:
    """Writes a named file into a local directory (the `--out` of `report`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, data: bytes) -> None:
        target = self.directory / name
        staged = target.with_suffix(target.suffix + ".tmp")
        staged.write_bytes(data)
        staged.replace(target)
