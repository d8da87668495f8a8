"""The demo's sample dataset: the committed files are the script's output, and
they cover every format, category and kind of flaw they claim to."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

from tests.producer.helpers import produce
from tokenmill.settings import Settings

SAMPLE = Path(__file__).resolve().parents[2] / "devstack" / "sample"
SCRIPT = SAMPLE.parent / "make_sample.py"


def _script():
    spec = importlib.util.spec_from_file_location("make_sample", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_sample_is_the_scripts_output(tmp_path: Path) -> None:
    written = _script().write_all(tmp_path)
    assert [p.name for p in written] == sorted(p.name for p in SAMPLE.iterdir())
    for path in written:
        assert path.read_bytes() == (SAMPLE / path.name).read_bytes(), path.name


def test_sample_covers_every_format_and_category(tmp_path: Path) -> None:
    offline = Settings(bootstrap_servers="127.0.0.1:9", state_dir=tmp_path / "state")
    outcome, _ = produce(offline, "sample", sorted(SAMPLE.iterdir()), dry_run=True)
    summary = outcome.summary
    assert summary is not None
    formats: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    for source in summary.sources:
        formats.update(source.formats)
        categories.update(source.by_category)
    assert set(formats) == {"sharegpt", "openai", "openai-request", "hermes", "available-tools",
                            "alpaca", "prompt"}
    assert all(categories[c] > 0 for c in ("plain", "system-prompt", "multi-turn", "tools"))
    assert 150 <= outcome.total <= 300
    assert summary.duplicates == 1
    assert set(summary.rejects) == {"invalid-json", "no-user-turn", "unknown-role"}
