"""Lineage coverage for `tokenmill status`: of the root's prompts (a
regenerate-turns lineage's conversations), how many have an accepted result
in some run of the lineage.

A redrive's prompts are dead letters of its parent, so they have no accepted
result anywhere above it: along a chain of redrives the runs' committed S3
line counts simply add up, exactly, without reading a DLQ. A lineage with a
replay needs the dead letters (`ops/dataset/index.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ops.dataset.lineage import LineageError, lineage
from ops.dataset.sources import Lineage, build_index, load_lineage
from schemas import RunSpec
from tokenmill.progress import GLANCE_SETTLE_S
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings


def counted_coverage(found: Lineage) -> tuple[int, int] | None:
    """(low, high) from the counters alone, when the lineage allows it (pure)."""
    if any(f.kind != "redrive" for f in found.facts[1:]):
        return None
    covered = sum(f.accepted for f in found.facts)
    return covered, covered


def lineage_coverage(settings: Settings, run_id: str,
                     specs: Mapping[str, RunSpec] | None = None) -> dict[str, Any] | None:
    """None for a run without parent or children, known from the registry
    (`specs`, else read now) alone: most runs, for which `status` reads no
    counters twice. A glance, like `status`: counters settle at most
    GLANCE_SETTLE_S."""
    try:
        if specs is None:
            specs = RunRegistry(settings).all()
        if len(lineage(specs, run_id)) == 1:
            return None
        found = load_lineage(settings, run_id, settle_s=GLANCE_SETTLE_S, specs=specs)
    except LineageError as exc:  # a branching lineage, a missing parent: say so, go on
        return {"error": str(exc)}
    bounds = counted_coverage(found)
    if bounds is None:
        summary = build_index(settings, found).summary()
        bounds = summary.covered_low, summary.covered_high
    unit = "conversations" if found.specs[0].multi_turn == "regenerate-turns" else "prompts"
    return {"runs": [s.run_id for s in found.specs], "prompts": found.facts[0].prompts,
            "unit": unit,
            "with_result": bounds[0], "with_result_at_most": bounds[1],
            "complete": found.complete}


def coverage_line(coverage: dict[str, Any]) -> str:
    if "error" in coverage:
        return f"lineage: {coverage['error']}"
    low, high, total = coverage["with_result"], coverage["with_result_at_most"], coverage["prompts"]
    share = f"{100 * low / total:.1f}%" if total else "-"
    count = f"{low:,}" if low == high else f"{low:,}-{high:,}"
    unit = coverage.get("unit", "prompts")
    return (f"lineage coverage ({' → '.join(coverage['runs'])}): {count} of {total:,} {unit} "
            f"have an accepted result ({share}){'' if coverage['complete'] else ', in progress'}")
