"""Tests that need a tool of the machine (make, Java, systemd-analyze): on a
developer's machine without it they skip; in CI (the `CI` environment
variable set, as `.ci/run` does) a missing tool fails the test with one line
naming it, so that CI never passes by skipping what it was meant to run."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def require(tool: str, problem: str | None) -> None:
    """Go on when `problem` is None; else skip, or in CI fail, naming `tool`."""
    if problem is None:
        return
    if in_ci():
        pytest.fail(f"CI must have {tool}: {problem}", pytrace=False)
    pytest.skip(f"needs {tool} ({problem}); in CI this fails")


def require_on_path(command: str) -> str:
    """The path of `command`, after `require` (skipped or failed without it)."""
    found = shutil.which(command)
    require(command, None if found else f"`{command}` is not on PATH")
    assert found is not None
    return found
