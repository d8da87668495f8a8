"""Pass 1: every input record -> normalized, deduplicated prompts in the spool.

Streams each file once, in the order given. Each record is decoded, its
format normalized, the multi-turn policy applied; each resulting prompt gets
its id, is dropped if seen before, and is written to its bucket's spool file
(bucket = source x category). Rejected records go to the rejects file. Memory
holds only the dedupe keys and counters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from producer import records
from producer.errors import StrictStop
from producer.formats import RawRecord, RawRow, decode, decode_error, decode_json, normalize
from producer.ids import SeenIds, encode_messages, prompt_id
from producer.inputs import Source
from producer.multiturn import apply_policy
from producer.readers import InputReader, ReadProblem
from producer.rejects import Reject, RejectsFile, excerpt
from producer.spool import SpoolWriter
from producer.summary import CATEGORIES, SourceStats, Summary
from schemas.run import MultiTurnPolicy, ToolMode
from tokenmill.log import get_logger

log = get_logger("tokenmill.producer")

_CATEGORY_INDEX: dict[str, int] = {c: i for i, c in enumerate(CATEGORIES)}
PROGRESS_EVERY = 2048  # records between progress callbacks


def bucket_of(source_index: int, category: str) -> int:
    """Fixed bucket numbering: source-major, categories in CATEGORIES order."""
    return source_index * len(CATEGORIES) + _CATEGORY_INDEX[category]


def bucket_label(sources: list[Source], bucket: int) -> str:
    source, cat = divmod(bucket, len(CATEGORIES))
    return f"{sources[source].name}/{CATEGORIES[cat]}"


@dataclass(frozen=True)
class IngestOptions:
    run: str
    policy: MultiTurnPolicy
    tool_mode: ToolMode
    strict: bool = False


@dataclass
class IngestResult:
    summary: Summary
    bucket_counts: list[int]  # records per bucket, indexed by bucket_of()

    @property
    def total(self) -> int:
        return sum(self.bucket_counts)


def ingest(sources: list[Source], options: IngestOptions, spool: SpoolWriter,
           rejects: RejectsFile,
           progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """Read every source into the spool. `progress(bytes_done, records)` is
    called every few thousand records."""
    summary = Summary(sources=[SourceStats(s.name) for s in sources])
    counts = [0] * (len(sources) * len(CATEGORIES))
    seen = SeenIds()
    bytes_before = 0
    records_read = 0
    for index, source in enumerate(sources):
        stats = summary.sources[index]
        reader = InputReader(source.path)
        state = _FileState(source, index, stats, summary, options, rejects, counts, seen, spool)
        record = state.record
        for line, data in reader:
            record(line, data)
            records_read += 1
            if progress is not None and not records_read % PROGRESS_EVERY:
                progress(bytes_before + reader.position, records_read)
        state.finish()
        bytes_before += reader.size
        if progress is not None:
            progress(bytes_before, records_read)
        if stats.records == 0:
            warning = f"{source.path}: empty file, no records"
            summary.warnings.append(warning)
            log.warning("empty input", file=str(source.path))
    return IngestResult(summary, counts)


class _FileState:
    """The per-record work for one file, with its collaborators bound once."""

    def __init__(self, source: Source, index: int, stats: SourceStats, summary: Summary,
                 options: IngestOptions, rejects: RejectsFile, counts: list[int],
                 seen: SeenIds, spool: SpoolWriter) -> None:
        self.source = source
        self.index = index
        self.stats = stats
        self.summary = summary
        self.options = options
        self.rejects = rejects
        self.counts = counts
        self.seen = seen
        self.spool = spool
        self.run_json = records.json_string(options.run)
        self.source_json = records.json_string(source.name)
        self.buckets: dict[str, int] = {c: bucket_of(index, c) for c in CATEGORIES}
        self.category_json: dict[str, bytes] = {c: records.json_string(c) for c in CATEGORIES}
        self.writers: dict[str, Callable[[bytes], int]] = {}

    def writer(self, category: str) -> Callable[[bytes], int]:
        write = self.writers.get(category)
        if write is None:
            write = self.writers[category] = self.spool.writer(self.buckets[category])
        return write

    def reject(self, line: int, reason: str, detail: str, data: object) -> None:
        self.stats.rejected += 1
        self.summary.reject(reason, f"{self.source.name}:{line}")
        self.rejects.write(self.source.name, line, reason, detail, excerpt(data))
        if self.options.strict:
            raise StrictStop(f"{self.source.path}:{line}: {reason}: {detail} "
                             f"(--strict stops at the first rejected record)")

    def record(self, line: int, data: bytes | dict[str, object] | ReadProblem) -> None:
        """Decode, normalize, apply the policy; spool each new prompt."""
        stats = self.stats
        stats.records += 1
        options = self.options
        raw: RawRecord | RawRow
        try:
            if isinstance(data, bytes):
                try:
                    raw = decode_json(data)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    raise decode_error(exc, data) from None
            elif isinstance(data, ReadProblem):
                raise Reject(data.reason, data.detail)
            else:
                raw = decode(data)
            normalized = normalize(raw, options.tool_mode)
            prompts = apply_policy(normalized, options.policy)
        except Reject as exc:
            self.reject(line, exc.reason, exc.detail, data)
            return
        fmt = normalized.format
        stats.formats[fmt] += 1
        tools = normalized.tools
        tools_json = records.encode_tools(tools) if tools else b"null"
        seen = self.seen
        counts = self.counts
        for messages, turn, cat, user_turns in prompts:
            messages_json = encode_messages(messages)
            pid, key = prompt_id(messages_json, tools)
            if key in seen:
                stats.duplicates += 1
                continue
            spooled = records.spool_line(
                pid.encode(), self.run_json, messages_json, self.source_json,
                records.json_string(fmt), self.category_json[cat], line, turn, tools_json)
            size = len(spooled) - records.SPOOL_OVERHEAD
            if size > records.MAX_RECORD_BYTES:
                where = f" (user turn {turn})" if turn is not None else ""
                self.reject(line, "too-large",
                            f"prompt{where} is {size:,} bytes encoded; Kafka takes at "
                            f"most {records.MAX_RECORD_BYTES:,}", data)
                continue
            seen.add(key)
            (self.writers.get(cat) or self.writer(cat))(spooled)
            counts[self.buckets[cat]] += 1
            if user_turns > 1:
                stats.several_user_turns += 1

    def finish(self) -> None:
        """Per-category prompt counts come from the bucket counts."""
        for cat in CATEGORIES:
            n = self.counts[self.buckets[cat]]
            if n:
                self.stats.by_category[cat] = n
        self.stats.prompts = sum(self.stats.by_category.values())
