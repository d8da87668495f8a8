"""A run's lineage: the chain of runs whose accepted results make one dataset.

The chain starts at a produced run (the root: its prompt ids are the
dataset's), follows replays and redrives down to the run asked about, and on
below it while each run has exactly one child. A produced run with
`--parent-run` has prompts of its own, so it roots a lineage of its own. Pure
functions of the registered specs.
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas import RunSpec
from schemas.run import RunKind


class LineageError(ValueError):
    """The lineage cannot be followed (a parent is missing, a run is ambiguous)."""


class AmbiguousLineage(LineageError):
    """A run below the one asked about has several children: name one of them."""


def kind_of(spec: RunSpec) -> RunKind:
    """Why the run exists. Specs registered before `origin` existed: a run
    with a parent that reads its parent's prompts topic is a replay."""
    if spec.origin.kind == "produce" and spec.parent_run and spec.prompts_topic:
        return "replay"
    return spec.origin.kind


def children(specs: Mapping[str, RunSpec], run_id: str) -> list[str]:
    """Replays and redrives of the run, by id."""
    return sorted(s.run_id for s in specs.values()
                  if s.parent_run == run_id and kind_of(s) != "produce")


def ancestors(specs: Mapping[str, RunSpec], run_id: str) -> list[RunSpec]:
    """From the lineage's root down to the run itself."""
    chain = [specs[run_id]]
    seen = {run_id}
    while kind_of(chain[-1]) != "produce":
        parent = chain[-1].parent_run
        if parent is None or parent not in specs:
            raise LineageError(f"run {chain[-1].run_id} names parent {parent!r}, which is not "
                               "registered")
        if parent in seen:
            raise LineageError(f"run {run_id}: the parent chain loops at {parent}")
        seen.add(parent)
        chain.append(specs[parent])
    return chain[::-1]


def lineage(specs: Mapping[str, RunSpec], run_id: str) -> list[RunSpec]:
    """Root first, each run the parent of the next; the run asked about and
    its single-child descendants included."""
    if run_id not in specs:
        raise LineageError(f"run {run_id!r} is not registered")
    chain = ancestors(specs, run_id)
    while True:
        below = children(specs, chain[-1].run_id)
        if not below:
            return chain
        if len(below) > 1:
            raise AmbiguousLineage(
                f"run {chain[-1].run_id} has {len(below)} children ({', '.join(below)}): "
                "their results are alternatives, not one dataset; name the run whose "
                f"lineage you mean (e.g. {below[-1]})")
        chain.append(specs[below[0]])


def describe(spec: RunSpec) -> str:
    """One line: why the run exists and what it generates with."""
    g = spec.generation
    kind = kind_of(spec)
    why = {"produce": "produced", "replay": f"replay of {spec.parent_run}",
           "redrive": f"redrive of {spec.parent_run} ({','.join(spec.origin.reasons)})"}[kind]
    return (f"{spec.run_id}: {why}; model {g.model}, max_tokens {g.max_tokens}, "
            f"thinking {'on' if g.enable_thinking else 'off'}, temperature {g.temperature}, "
            f"settings {spec.settings_hash}")
