"""S3 key layout: run, partition and the batch's first offset, nothing else.

    {prefix}{run}/partition={p:04d}/offset={first:020d}.jsonl[.zst]

A replayed batch starts at the same first offset, so it lands on the same
key: a replay overwrites instead of duplicating. The zero padding makes the
lexicographic order of keys (what S3 lists) the offset order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Compression = Literal["none", "zstd"]

EXTENSIONS: dict[str, str] = {"none": ".jsonl", "zstd": ".jsonl.zst"}
PARTITION_DIGITS = 4
OFFSET_DIGITS = 20  # an int64 offset has at most 19 digits

_KEY = re.compile(
    r"^(?P<prefix>(?:.*/)?)(?P<run>[A-Za-z0-9][A-Za-z0-9_-]*)/partition=(?P<partition>\d{4,})"
    r"/offset=(?P<offset>\d{20})(?P<ext>\.jsonl(?:\.zst)?)$"
)


def normalize_prefix(prefix: str) -> str:
    """'' stays ''; anything else ends with exactly one '/' and has no leading '/'."""
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


def partition_dir(prefix: str, run: str, partition: int) -> str:
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    return f"{normalize_prefix(prefix)}{run}/partition={partition:0{PARTITION_DIGITS}d}/"


def stem(prefix: str, run: str, partition: int, first_offset: int) -> str:
    """The key without its extension."""
    if first_offset < 0:
        raise ValueError(f"offset must be >= 0, got {first_offset}")
    return f"{partition_dir(prefix, run, partition)}offset={first_offset:0{OFFSET_DIGITS}d}"


def object_key(prefix: str, run: str, partition: int, first_offset: int,
               compression: Compression = "none") -> str:
    return stem(prefix, run, partition, first_offset) + EXTENSIONS[compression]


def candidate_keys(prefix: str, run: str, partition: int, first_offset: int) -> list[str]:
    """Every key a batch starting at this offset may have been written under
    (by an earlier incarnation with either compression)."""
    base = stem(prefix, run, partition, first_offset)
    return [base + ext for ext in EXTENSIONS.values()]


@dataclass(frozen=True)
class ParsedKey:
    prefix: str
    run: str
    partition: int
    first_offset: int
    compression: Compression


def parse_key(key: str) -> ParsedKey:
    match = _KEY.match(key)
    if match is None:
        raise ValueError(f"not a tokenmill sink key: {key!r}")
    ext = match["ext"]
    return ParsedKey(
        prefix=match["prefix"],
        run=match["run"],
        partition=int(match["partition"]),
        first_offset=int(match["offset"]),
        compression="zstd" if ext.endswith(".zst") else "none",
    )
