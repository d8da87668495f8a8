"""The README's two commands are the ones the Makefile provides and CI runs,
and they check the machine before installing anything (no drift)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools import require_on_path

CHECKOUT = Path(__file__).resolve().parents[2]


def readme_two_commands() -> list[str]:
    readme = (CHECKOUT / "README.md").read_text()
    section = readme.split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def ci_commands() -> list[str]:
    lines = (CHECKOUT / ".ci" / "run").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_readme_shows_make_demo_then_make_test() -> None:
    assert readme_two_commands() == ["make demo", "make test"]


def test_ci_runs_the_readme_test_command_and_nothing_else_runs_tests() -> None:
    test_command = readme_two_commands()[1]
    commands = ci_commands()
    assert commands[-1] == test_command
    assert commands.count(test_command) == 1
    # beside it, the manual and the linters (their own failures, not tests),
    # waited for at the exit
    assert "{ make docs && make lint; }" in " ".join(commands)
    assert "trap finish EXIT" in commands
    assert not any("pytest" in command for command in commands)


def _outside_make() -> dict[str, str]:
    """The environment without an enclosing make's variables (under `make test`
    a nested make would print "Entering directory" lines and inherit its flags),
    nor the interpreter .ci/run chose (PYTHON): the Makefile's default is checked."""
    return {k: v for k, v in os.environ.items()
            if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "PYTHON")}


def _dry_run(target: str, venv: Path) -> list[str]:
    result = subprocess.run([require_on_path("make"), "-n", target, f"VENV={venv}", "ARGS="],
                            cwd=CHECKOUT, capture_output=True, text=True, timeout=60,
                            env=_outside_make())
    assert result.returncode == 0, result.stderr
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize(("target", "extra", "last"), [
    ("demo", "local", "{venv}/bin/tokenmill demo"),
    # the `alone` tests after the rest, on their own (see the Makefile)
    ("test", "test",
     "{venv}/bin/python -m pytest -q --durations=30 --cpu-durations=30 -n 0 -m alone "
     "|| [ $? -eq 5 ]"),
    ("test-containers", "test",
     "TOKENMILL_TEST_SERVICES=containers {venv}/bin/python -m pytest -q --durations=30 -n 0 "
     "tests/e2e/test_compose.py"),
])
def test_make_targets_check_then_create_install_and_run(tmp_path: Path, target: str,
                                                        extra: str, last: str) -> None:
    venv = tmp_path / "venv"
    steps = _dry_run(target, venv)
    assert steps[0].endswith("python3 -m devstack.prerequisites")
    assert steps[1] == f"python3 -m venv {venv}"
    assert any("pip install" in step and f"-e '.[{extra}]'" in step for step in steps)
    assert " ".join(steps[-1].split()) == last.format(venv=venv)


def test_make_demo_on_a_machine_without_java_and_maven_stops_with_one_line(tmp_path: Path) -> None:
    make = require_on_path("make")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    venv = tmp_path / "venv"
    result = subprocess.run(
        [make, "demo", f"VENV={venv}"], cwd=CHECKOUT, capture_output=True, text=True,
        timeout=120, env={"PATH": str(bin_dir), "TOKENMILL_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode != 0
    missing = [line for line in result.stderr.splitlines() if line.startswith("missing: ")]
    assert len(missing) == 1, result.stderr
    assert "Java 17+" in missing[0] and "Maven" in missing[0]
    assert not venv.exists()  # nothing installed before the check passed
