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

from collections.abc import Callable, Iterator
from pathlib import Path

from ops.dataset.index import LineageIndex
from ops.dataset.lineage import LineageError
from ops.dataset.sources import Lineage, build_index, load_lineage, s3_location
from ops.export import source
from ops.export.command import sample_id
from ops.report import figures, render
from ops.report.aggregate import Aggregator, TimelineBuilder
from ops.report.figures import Figures
from schemas.progress import decode_progress
from sink.s3_writer import make_client
from tokenmill.kafka import committed, topics
from tokenmill.log import get_logger
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


def build_figures(settings: Settings, run_id: str) -> Figures:
    found = load_lineage(settings, run_id)
    single = len(found.specs) == 1
    index: LineageIndex | None = None
    if not single:
        busy = [f.run_id for f in found.facts if not f.complete]
        if busy:
            raise ReportRefused(f"run(s) of the lineage still in progress: {', '.join(busy)}; "
                                f"report on one run of it (e.g. `tokenmill report {busy[0]}`) "
                                "or once every run is finished")
        index = build_index(settings, found)
    agg = Aggregator([spec.generation.max_tokens for spec in found.specs])
    _read_results(settings, found, index, agg)
    timeline = TimelineBuilder()
    for spec in found.specs:
        timeline.add_plan(spec.run_id, spec.estimate.requests_per_s if spec.estimate else None)
        _read_progress(settings, spec.run_id, timeline)
    notes = [f"run {f.run_id} is in progress: {p.persisted:,} of {p.published:,} published "
             "prompts persisted so far" for f, p in zip(found.facts, found.progress)
             if not f.complete]
    if not single:
        notes.append("a lineage: each prompt of the root once, its accepted result from the "
                     "newest run that has one, else its last dead letter")
    title = (f"tokenmill report: {run_id}" if single else
             f"tokenmill report: lineage of {run_id} (root {found.specs[0].run_id})")
    return agg.figures(title, [s.run_id for s in found.specs], timeline.timeline(),
                       timeline.accept_by_gpu(), notes)


def _read_results(settings: Settings, found: Lineage, index: LineageIndex | None,
                  agg: Aggregator) -> None:
    client = make_client(endpoint_url=settings.s3_endpoint_url, region=settings.s3_region)
    clean = index.clean_winner() if index else None
    for j, spec in enumerate(found.specs):
        bucket, prefix = s3_location(settings, spec)
        keys = source.object_keys(client, bucket, prefix, spec.run_id)
        for line in source.lines(client, bucket, keys):
            if index is None or index.winner(sample_id(line), clean) == j:
                agg.add_line(line)
        for key, value in _values(settings, topics.dlq_topic(spec.run_id)):
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
