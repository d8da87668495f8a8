"""Read a dataset the way `tokenmill produce` does, and draw the plan's sample.

The producer's own pass 1 (`producer.ingest`) reads, normalizes, applies the
multi-turn policy and deduplicates into one spool file per bucket (source x
category) in a scratch directory; the sample is then picked from those
buckets. So the plan sees exactly the prompts, counts and categories a run of
the same files would publish.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ops.plan.sampling import stratified
from producer import records
from producer.ingest import IngestOptions, ingest
from producer.inputs import fingerprint, resolve
from producer.rejects import RejectsFile
from producer.spool import SpoolReader, SpoolWriter, bucket_path
from producer.summary import CATEGORIES
from schemas.plan import Dataset, Stratum
from schemas.prompt import PromptRecord
from schemas.run import MultiTurnPolicy, ToolMode

_decoder = msgspec.json.Decoder(PromptRecord)


@dataclass(frozen=True)
class SampledPrompt:
    stratum: int  # index into Dataset.strata
    prompt: PromptRecord


@dataclass(frozen=True)
class DatasetSample:
    dataset: Dataset
    prompts: list[SampledPrompt]


def read_sample(files: list[Path], *, multi_turn: MultiTurnPolicy, tools: ToolMode,
                size: int, seed: int, scratch: Path | None = None,
                progress: Callable[[int, int], None] | None = None,
                total_bytes: Callable[[int], None] | None = None) -> DatasetSample:
    """Count every prompt of the files and sample `size` of them.

    The spool (about the size of the normalized prompts) goes to a temporary
    directory under `scratch` (the system's temporary directory if None) and
    is removed at the end. `total_bytes(n)` is called once with the input
    size, `progress(bytes, records)` while reading (for a progress bar)."""
    sources = resolve(files)
    inputs = tuple(fingerprint(s) for s in sources)
    if total_bytes is not None:
        total_bytes(sum(f.size for f in inputs))
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tokenmill-plan-", dir=scratch) as temporary:
        directory = Path(temporary)
        spool = SpoolWriter(directory / "spool")
        rejects = RejectsFile(directory / "rejects.jsonl")
        try:
            result = ingest(sources, IngestOptions(run="plan", policy=multi_turn, tool_mode=tools),
                            spool, rejects, progress)
        finally:
            spool.close()
            rejects.close()
        counts = result.bucket_counts
        picks = stratified(counts, size, seed)
        strata: list[Stratum] = []
        prompts: list[SampledPrompt] = []
        for bucket, count in enumerate(counts):
            if not count:
                continue
            source, category = divmod(bucket, len(CATEGORIES))
            index = len(strata)
            strata.append(Stratum(source=sources[source].name, category=CATEGORIES[category],
                                  prompts=count, sampled=len(picks[bucket])))
            prompts.extend(SampledPrompt(index, p) for p in
                           _read_positions(bucket_path(directory / "spool", bucket), picks[bucket]))
    summary = result.summary
    dataset = Dataset(prompts=result.total, rejected=summary.rejected,
                      duplicates=summary.duplicates, multi_turn=multi_turn, tools=tools,
                      inputs=inputs, strata=tuple(strata))
    return DatasetSample(dataset, prompts)


def _read_positions(path: Path, positions: list[int]) -> list[PromptRecord]:
    """The records at `positions` (ascending) of one spool file."""
    out: list[PromptRecord] = []
    if not positions:
        return out
    reader = SpoolReader(path)
    try:
        current = 0
        for position in positions:
            while current < position:
                reader.skip()
                current += 1
            line = reader.next()
            current += 1
            out.append(_decoder.decode(records.finish(line[32:-1], 0)))
    finally:
        reader.close()
    return out
