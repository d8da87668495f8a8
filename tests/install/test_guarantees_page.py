"""docs/guarantees.md names, for each clause, the tests that prove it as
`tests/<file>.py::<test>`. Every such reference anywhere in the manual (and
the README) must name a test function that exists, read with `ast`, so the
page cannot go stale when a test is renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
DOCS = CHECKOUT / "docs"
GUARANTEES = DOCS / "guarantees.md"
REFERENCE = re.compile(r"(tests/[\w/]+\.py)::([\w:]+)")


def references(text: str) -> list[tuple[str, str]]:
    return REFERENCE.findall(text)


def defined(path: Path) -> set[str]:
    """`name` of every test function, `Class::name` of every test method."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}::{item.name}" for item in node.body
                         if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef))
    return {name for name in names if name.split("::")[-1].startswith("test_")}


def missing(refs: list[tuple[str, str]]) -> list[str]:
    wrong = []
    for file, name in refs:
        path = CHECKOUT / file
        if not path.is_file():
            wrong.append(f"{file}::{name}: no such file")
        elif name not in defined(path):
            wrong.append(f"{file}::{name}: no such test")
    return wrong


def test_every_test_the_manual_names_exists() -> None:
    pages = [CHECKOUT / "README.md", *sorted(DOCS.rglob("*.md"))]
    refs = [ref for page in pages for ref in references(page.read_text())]
    assert len(refs) > 40
    assert missing(refs) == []


def test_every_guarantee_names_its_tests() -> None:
    text = GUARANTEES.read_text()
    sections = re.split(r"\n## ", text)[1:]
    assert len(sections) >= 7
    for section in sections:
        title = section.splitlines()[0]
        if title == "What is not guaranteed":
            continue
        assert references(section), f"guarantee {title!r} names no test"


def test_the_check_catches_a_renamed_test_and_a_moved_file() -> None:
    refs = references("`tests/consumer/test_resilience.py::test_kill_9_and_restart_repeatedly`, "
                      "`tests/consumer/test_resilience.py::test_kill_nine`, "
                      "`tests/nowhere/test_gone.py::test_x`")
    assert len(refs) == 3
    assert missing(refs) == [
        "tests/consumer/test_resilience.py::test_kill_nine: no such test",
        "tests/nowhere/test_gone.py::test_x: no such file",
    ]
