"""What an export holds: the plan (format, lineage, shard size: everything the
bytes depend on), each finished shard with its count and checksum, and per
run statistics for the dataset card.

`manifest.json` is written last, when every shard is in place; until then
`_export_progress.json` holds the same document with the shards finished so
far, so a killed export resumes after them. Both carry no clock time:
exporting the same lineage twice gives the same bytes.
"""

from __future__ import annotations

import msgspec

from schemas import GenerationSettings, TrainingSample
from schemas.sample import ConversationSample

MANIFEST = "manifest.json"
PROGRESS = "_export_progress.json"
CARD = "README.md"


class Part(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One run of the lineage and what the dataset takes from it."""

    run: str
    kind: str
    parent: str | None
    reasons: tuple[str, ...]
    settings_hash: str
    generation: GenerationSettings
    records: int  # accepted results of this run in the dataset


class Plan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: str
    root: str
    parts: tuple[Part, ...]  # root first
    records: int  # accepted results (samples, or conversations) the lineage gives
    shard_records: int  # accepted results per shard
    without_result: int  # root prompts no run has an accepted result for
    # regenerate-turns lineages: a row per conversation, and whether the
    # partial ones (`tool_unresolved`, `tool_limit`) are exported cut.
    conversations: bool = False
    include_partial: bool = False

    @property
    def shards(self) -> int:
        return -(-self.records // self.shard_records)

    def shard_name(self, k: int) -> str:
        ext = "parquet" if self.format == "parquet" else "jsonl"
        return f"{self.format}-{k:05d}-of-{max(self.shards, 1):05d}.{ext}"


class RunStats(msgspec.Struct, forbid_unknown_fields=True):
    """Token and speculative-decoding totals of a run's samples."""

    records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    spec_tokens: int = 0  # completion tokens of samples that report an accept length
    accept_weighted: float = 0.0  # sum of accept length x completion tokens
    models: dict[str, int] = {}  # samples by the model name the server reported
    # Conversations: generated steps in the rows, partial conversations
    # exported up to their last complete turn, and those left out.
    turns: int = 0
    partial: int = 0
    left_out: int = 0

    def add_conversation(self, sample: ConversationSample, cut: bool) -> None:
        """A conversation's row (`cut`: a partial one, up to its last complete turn)."""
        self.records += 1
        self.partial += cut
        self.models[sample.model] = self.models.get(sample.model, 0) + 1
        for step in sample.steps:
            usage = step.usage
            self.turns += 1
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
            self.reasoning_tokens += usage.reasoning_tokens
            if step.spec.accept_length is not None:
                self.spec_tokens += usage.completion_tokens
                self.accept_weighted += step.spec.accept_length * usage.completion_tokens

    def add(self, sample: TrainingSample) -> None:
        usage = sample.usage
        self.records += 1
        self.models[sample.model] = self.models.get(sample.model, 0) + 1
        self.prompt_tokens += usage.prompt_tokens
        self.completion_tokens += usage.completion_tokens
        self.reasoning_tokens += usage.reasoning_tokens
        if sample.spec.accept_length is not None:
            self.spec_tokens += usage.completion_tokens
            self.accept_weighted += sample.spec.accept_length * usage.completion_tokens

    def merge(self, other: RunStats) -> None:
        for name in self.__struct_fields__:
            if name == "models":
                merged = dict(self.models)
                for model, n in other.models.items():
                    merged[model] = merged.get(model, 0) + n
                self.models = dict(sorted(merged.items()))
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def accept_length(self) -> float | None:
        return self.accept_weighted / self.spec_tokens if self.spec_tokens else None


class Shard(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    records: int  # rows
    bytes: int
    sha256: str
    runs: dict[str, RunStats]  # by run of origin
    # Accepted conversations of this shard's stretch without a row (partial
    # ones, left out): a shard covers `records + left_out` accepted results.
    left_out: int = 0


class Manifest(msgspec.Struct, forbid_unknown_fields=True):
    plan: Plan
    shards: list[Shard] = []
    complete: bool = False
    v: int = 1

    @property
    def records_done(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def results_done(self) -> int:
        """Accepted results the finished shards cover (rows and left out)."""
        return sum(s.records + s.left_out for s in self.shards)

    def totals(self) -> dict[str, RunStats]:
        """Per run, over the finished shards, in lineage order."""
        out = {part.run: RunStats() for part in self.plan.parts}
        for shard in self.shards:
            for run, stats in shard.runs.items():
                out[run].merge(stats)
        return out


_encoder = msgspec.json.Encoder(order="deterministic")


def encode(manifest: Manifest) -> bytes:
    return msgspec.json.format(_encoder.encode(manifest), indent=2) + b"\n"


def decode(data: bytes) -> Manifest:
    return msgspec.json.decode(data, type=Manifest)
