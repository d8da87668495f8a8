"""The design card's layout: which top-level package may import which.

Services depend on `schemas` and the plumbing (`tokenmill`), never on each
other; nothing below imports what stands above it. The simulator and the dev
stack are tools of their own: the plumbing and the services never import
them. `tokenmill/cli.py` names every command by a string and imports it
lazily, so it is no import edge."""

from __future__ import annotations

import ast
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]

# package -> the packages of ours it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "tokenmill": {"schemas"},
    "sglang_sim": {"tokenmill", "schemas"},
    "producer": {"tokenmill", "schemas"},
    "consumer": {"tokenmill", "schemas"},
    "sink": {"tokenmill", "schemas"},
    "ops": {"tokenmill", "schemas", "producer", "consumer", "sink", "sglang_sim"},
    "devstack": {"tokenmill", "schemas", "sglang_sim"},
}


def imports_of(package: str) -> dict[str, set[str]]:
    """Our top-level packages each file of `package` imports, by file."""
    found: dict[str, set[str]] = {}
    for path in sorted((CHECKOUT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in ALLOWED and top != package:
                    found.setdefault(str(path.relative_to(CHECKOUT)), set()).add(top)
    return found


def test_no_package_imports_what_stands_above_it() -> None:
    wrong = {f"{file} imports {sorted(tops - ALLOWED[package])}"
             for package in ALLOWED
             for file, tops in imports_of(package).items() if tops - ALLOWED[package]}
    assert wrong == set()


def test_the_check_sees_imports() -> None:
    """Guards the test above against passing because it reads nothing."""
    assert "schemas" in imports_of("consumer")["consumer/worker.py"]
    assert imports_of("ops")


def test_deploy_and_docker_sit_at_the_top_level() -> None:
    assert (CHECKOUT / "deploy" / "systemd").is_dir()
    assert (CHECKOUT / "docker" / "Dockerfile").is_file()
    assert not (CHECKOUT / "tokenmill" / "deploy").exists()


def test_tools_open_with_a_line_that_says_what_they_are() -> None:
    for package in ("sglang_sim", "devstack", "tokenmill/kafka"):
        doc = ast.get_docstring(ast.parse((CHECKOUT / package / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()[0]) > 20, package
