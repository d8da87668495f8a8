"""Every `tokenmill ...` command line in the code blocks of the README and of
the manual's pages (`docs/**/*.md`) names a command that exists and only
flags that command takes: the manual stays true when flags are renamed or
removed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click

from tokenmill.cli import cli

CHECKOUT = Path(__file__).resolve().parents[2]
README = CHECKOUT / "README.md"
DOCS = CHECKOUT / "docs"
BLOCK = re.compile(r"```(?:bash|console|sh)\n(.*?)```", re.S)


def command_lines(text: str) -> list[str]:
    """`tokenmill` invocations in bash/console blocks, continuations joined,
    prompts and trailing comments dropped."""
    found = []
    for block in BLOCK.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
                if part.startswith("tokenmill "):
                    found.append(part.split(" #", 1)[0].strip())
    return found


def pages() -> list[Path]:
    """The README and every page of the manual."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def manual_lines() -> list[tuple[str, str]]:
    """(page, command line) over the README and the manual."""
    return [(str(page.relative_to(CHECKOUT)), line)
            for page in pages() for line in command_lines(page.read_text())]


def resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    command: click.Command = cli
    rest = words
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        if sub is None:
            raise AssertionError(f"no command {rest[0]!r} under {command.name!r}")
        command, rest = sub, rest[1:]
    return command, rest


def flags_of(command: click.Command) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("-"))
    return names


def test_the_readme_and_the_manual_show_many_commands() -> None:
    assert len(pages()) > 20, "the manual's pages are not where this test reads them"
    assert command_lines(README.read_text()), "the README shows no command"
    lines = [line for _, line in manual_lines()]
    assert len(lines) > 40
    assert any(line.startswith("tokenmill status --run") and "--check" in line for line in lines)


def test_every_readme_and_manual_command_line_uses_real_commands_and_flags() -> None:
    problems = []
    for page, line in manual_lines():
        try:
            words = shlex.split(line)[1:]
        except ValueError:
            continue  # a line with shell constructs the example abbreviates
        try:
            command, rest = resolve(words)
        except AssertionError as exc:
            problems.append(f"{page}: {line}: {exc}")
            continue
        known = flags_of(command)
        for word in rest:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                problems.append(f"{page}: {line}: {command.name} has no {flag}")
    assert problems == []


def test_the_check_catches_a_flag_that_does_not_exist() -> None:
    command, rest = resolve(shlex.split("tokenmill status --run r --chek")[1:])
    assert "--chek" not in flags_of(command) and "--check" in flags_of(command)
