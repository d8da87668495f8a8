"""The input files of a run: checked before anything else happens, named,
and fingerprinted for the run spec.

A run's spec records each input's name, size and sha256, so running the same
run id on a different or changed file is refused by the registry instead of
mixing two datasets in one run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from producer.errors import InputError
from producer.readers import check_readable
from schemas.run import InputFile

HASH_CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Source:
    path: Path
    name: str  # shortest path suffix that tells the inputs apart


def resolve(paths: list[Path]) -> list[Source]:
    """Readable regular files, each given once; InputError names the culprit."""
    if not paths:
        raise InputError("no input files given")
    seen: dict[Path, Path] = {}
    for path in paths:
        check_readable(path)
        real = path.resolve()
        if real in seen:
            raise InputError(f"input file given twice: {seen[real]} and {path}")
        seen[real] = path
    return [Source(path, name) for path, name in zip(paths, display_names(paths), strict=True)]


def display_names(paths: list[Path]) -> list[str]:
    """Base names, lengthened with parent folders only where two collide
    (shards named train-00000.parquet in several folders)."""
    parts = [path.resolve().parts for path in paths]
    depth = [1] * len(paths)
    while True:
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth, strict=True)]
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes:
            return names
        for i, name in enumerate(names):
            if name in clashes and depth[i] < len(parts[i]):
                depth[i] += 1


def fingerprint(source: Source) -> InputFile:
    digest = hashlib.sha256()
    size = 0
    try:
        with source.path.open("rb") as fh:
            while chunk := fh.read(HASH_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise InputError(f"cannot read {source.path}: {exc}") from None
    return InputFile(name=source.name, size=size, sha256=digest.hexdigest())
