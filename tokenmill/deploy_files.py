"""The files tokenmill carries in `deploy/` (Kafka's Maven file and broker
config, systemd units, monitoring) and `docker/` (container files): read from
the installed package or the source checkout, and filled in.

In a checkout they are the repository's top-level `deploy/` and `docker/`;
a wheel carries them inside the package (`tokenmill/deploy/`,
`tokenmill/docker/`, pyproject's package-dir mapping). They are read through
importlib.resources, so `tokenmill dev up`, `demo` and `deploy` work from a
wheel in any directory, not only from a source checkout.
A file marks what it needs with `@name@` placeholders (a syntax that systemd,
compose, shell and Grafana templates leave alone); rendering refuses a
placeholder without a value, so no file is written half filled in. A new
folder (say `deploy/prometheus/`) ships as soon as it is there (pyproject's
package data takes `deploy/**` and `docker/**`), and `folder_files` renders
all of it. Paths name the top folder: `deploy/kafka/pom.xml`, `docker/Dockerfile`.
"""

from __future__ import annotations

import importlib.resources
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

PLACEHOLDER = re.compile(r"@([a-z][a-z0-9_]*)@")


class TemplateError(ValueError):
    """A placeholder has no value."""


@dataclass(frozen=True)
class RenderedFile:
    """A file to write: `path` relative to the output directory."""

    path: str
    text: str
    mode: int = 0o644


SHIPPED = ("deploy", "docker")


def root() -> Traversable:
    """The folder that holds `deploy/` and `docker/`: the installed package
    (a wheel), else the source checkout the package is imported from."""
    package = importlib.resources.files("tokenmill")
    if package.joinpath("deploy").is_dir():
        return package
    checkout: Traversable = Path(__file__).resolve().parents[1]
    return checkout


def _shipped(path: str) -> bool:
    return path.split("/", 1)[0] in SHIPPED


def _resource(path: str) -> Traversable:
    resource = root().joinpath(*path.split("/"))
    if not _shipped(path) or not resource.is_file():
        raise FileNotFoundError(f"{path} is not among the files tokenmill ships")
    return resource


def read_text(path: str) -> str:
    """A shipped file's text, `path` such as `deploy/kafka/pom.xml`."""
    return _resource(path).read_text(encoding="utf-8")


def files_in(folder: str) -> list[str]:
    """Every shipped file under `folder` (`deploy/systemd`, `docker`), as paths
    such as `deploy/systemd/sglang.env`."""
    start = root().joinpath(*folder.split("/"))
    if not _shipped(folder) or not start.is_dir():
        raise FileNotFoundError(f"{folder} is not among the folders tokenmill ships")
    found: list[str] = []
    pending: list[tuple[str, Traversable]] = [(folder, start)]
    while pending:
        prefix, directory = pending.pop()
        for entry in directory.iterdir():
            if entry.name == "__pycache__":
                continue
            if entry.is_dir():
                pending.append((f"{prefix}/{entry.name}", entry))
            else:
                found.append(f"{prefix}/{entry.name}")
    return sorted(found)


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def render(text: str, values: Mapping[str, object], *, source: str = "template") -> str:
    """Fill every `@name@`; a name without a value is an error naming the file."""
    missing = placeholders(text) - values.keys()
    if missing:
        raise TemplateError(f"{source}: no value for {', '.join(sorted(missing))}")
    return PLACEHOLDER.sub(lambda match: str(values[match.group(1)]), text)


def render_file(path: str, values: Mapping[str, object]) -> str:
    return render(read_text(path), values, source=path)


def dockerfile(requirement: str) -> str:
    """The tokenmill image's Dockerfile; `requirement` is what pip installs
    (a wheel's path in the build context, or a package spec)."""
    return render_file("docker/Dockerfile", {"requirement": requirement})


def folder_files(folder: str, values: Mapping[str, object]) -> list[RenderedFile]:
    """Every file of a shipped folder, rendered, at its path below the folder."""
    return [RenderedFile(path.removeprefix(folder + "/"), render_file(path, values))
            for path in files_in(folder)]


def write_files(out_dir: Path, files: Iterable[RenderedFile]) -> list[Path]:
    """Write the files below `out_dir` (created as needed); returns their paths."""
    written = []
    for file in files:
        target = out_dir / file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(file.text, encoding="utf-8")
        target.chmod(file.mode)
        written.append(target)
    return written
