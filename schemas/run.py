"""The run spec: an immutable description of one generation job.

A spec is written once to `tokenmill.runs` and never changed; different
settings make a different run. `GenerationSettings.settings_hash` is stamped
on every completion so outputs of different settings can never be mixed
silently (the seed run mixed 4096- and 8192-token outputs).
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

import msgspec

MultiTurnPolicy = Literal["last-user", "strip-assistant", "per-user-turn", "regenerate-turns"]
ToolMode = Literal["structured", "as-given"]
Compression = Literal["none", "zstd"]  # of the S3 objects
RunKind = Literal["produce", "replay", "redrive"]

# Every reason a completion can be sent to the dead-letter topic.
DLQ_REASONS: frozenset[str] = frozenset(
    {"failed", "length", "empty", "trivial", "missing_reasoning"}
)

RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


class GenerationSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str = "default"
    max_tokens: int = 8192
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    seed: int | None = None
    enable_thinking: bool = True
    tools: ToolMode = "structured"

    def settings_hash(self) -> str:
        """Short stable digest; field order is fixed by the Struct."""
        return hashlib.sha256(msgspec.json.encode(self)).hexdigest()[:16]


class QAPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dlq_reasons: tuple[str, ...] = tuple(sorted(DLQ_REASONS))
    # An answer whose stripped content is at most this long counts as trivial
    # (the seed's first dataset was 87% "OK.").
    trivial_max_chars: int = 3

    def __post_init__(self) -> None:
        unknown = set(self.dlq_reasons) - DLQ_REASONS
        if unknown:
            raise ValueError(
                f"unknown DLQ reason(s) {sorted(unknown)}; known: {sorted(DLQ_REASONS)}"
            )
        # Canonical order, so equal policies encode to equal bytes.
        msgspec.structs.force_setattr(self, "dlq_reasons", tuple(sorted(set(self.dlq_reasons))))


class Estimate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What `tokenmill status` compares a run against. Set from the
    `--estimate-*` flags (the first two fields only) or from a plan
    (`produce --plan`). Fields after the first two were added later; specs
    written before decode with them unset."""

    requests_per_s: float | None = None  # all GPUs together
    output_tokens: float | None = None  # per completion
    truncated_share: float | None = None  # share cut at the run's max_tokens
    hours: float | None = None  # for the planned dataset, on `gpus` GPUs
    gpus: int | None = None
    concurrency: int | None = None  # per GPU, the plan's recommendation
    tokens_per_s: float | None = None  # output tokens/s, all GPUs together
    cost: float | None = None  # gpus x hours x the plan's price per GPU-hour
    source: Literal["flags", "plan"] | None = None


class S3Destination(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    bucket: str
    prefix: str = ""
    compression: Compression = "none"


class InputFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Fingerprint of one input file, so a different input for a run is refused."""

    name: str
    size: int
    sha256: str


class Origin(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Why a run exists: `produce` (prompt files), `replay` (its parent's
    prompts again, other settings) or `redrive` (its parent's dead letters
    with these reasons). `tokenmill dataset` follows replays and redrives from
    a produced run to merge a lineage's accepted results."""

    kind: RunKind = "produce"
    reasons: tuple[str, ...] = ()  # redrive: the DLQ reasons whose prompts it regenerates

    def __post_init__(self) -> None:
        unknown = set(self.reasons) - DLQ_REASONS
        if unknown:
            raise ValueError(
                f"unknown DLQ reason(s) {sorted(unknown)}; known: {sorted(DLQ_REASONS)}")
        if (self.kind == "redrive") != bool(self.reasons):
            raise ValueError("a redrive names the DLQ reasons it regenerates; only a redrive does")
        msgspec.structs.force_setattr(self, "reasons", tuple(sorted(set(self.reasons))))


class RunSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    run_id: str
    partitions: int
    generation: GenerationSettings = GenerationSettings()
    multi_turn: MultiTurnPolicy = "last-user"
    qa: QAPolicy = QAPolicy()
    s3: S3Destination | None = None
    parent_run: str | None = None
    estimate: Estimate | None = None
    inputs: tuple[InputFile, ...] = ()
    # Source prompts topic; None means this run's own `tokenmill.<run>.prompts`.
    # A replay run points it at its parent's prompts topic.
    prompts_topic: str | None = None
    origin: Origin = Origin()
    # GPUs the run was planned for (`produce --gpus`): a worker starts with
    # partitions / gpus group members, its share of an equal fleet, so the
    # fleet's first assignment is already one partition per member.
    gpus: int | None = None
    # `regenerate-turns`: a `module:function` that answers tool calls before
    # the dataset's recorded results are looked at (tokenmill/tool_results.py).
    tool_results: str | None = None
    v: int = 1

    def __post_init__(self) -> None:
        if not RUN_ID_PATTERN.match(self.run_id):
            raise ValueError(
                f"invalid run id {self.run_id!r}: use 1-100 letters, digits, '_' or '-'"
                " starting with a letter or digit"
            )
        if self.partitions < 1:
            raise ValueError(f"run {self.run_id}: partitions must be >= 1, got {self.partitions}")
        if self.gpus is not None and not 1 <= self.gpus <= self.partitions:
            raise ValueError(f"run {self.run_id}: gpus must be 1..partitions "
                             f"({self.partitions}), got {self.gpus}")
        if self.origin.kind != "produce" and not self.parent_run:
            raise ValueError(f"run {self.run_id}: a {self.origin.kind} needs a parent run")

    @property
    def settings_hash(self) -> str:
        return self.generation.settings_hash()
