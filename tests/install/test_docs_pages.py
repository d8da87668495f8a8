"""The manual's flag tables are generated from the click commands
(docs/hooks/flags.py, an MkDocs hook): every command has a page under
docs/commands/ holding its marker, the generator renders a table for each
with a row per flag the command takes, and a marker naming no command fails
instead of rendering nothing. `make docs` builds the site itself."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import click
import pytest

from tokenmill.cli import cli
from tokenmill.settings import OPTIONS

CHECKOUT = Path(__file__).resolve().parents[2]
DOCS = CHECKOUT / "docs"
NAV = CHECKOUT / "mkdocs.yml"


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_flags_hook",
                                                  DOCS / "hooks" / "flags.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


flags = _hook()


def _markers() -> dict[str, list[str]]:
    """Marker path -> the pages (under docs/) that hold it."""
    found: dict[str, list[str]] = {}
    for page in sorted(DOCS.rglob("*.md")):
        for path in flags.FLAGS.findall(page.read_text()):
            found.setdefault(path.strip(), []).append(str(page.relative_to(DOCS)))
    return found


def _command(path: str) -> click.Command:
    command: click.Command = cli
    for word in path.split()[1:]:
        assert isinstance(command, click.Group)
        sub = command.get_command(click.Context(command), word)
        assert sub is not None, path
        command = sub
    return command


def test_every_command_group_has_a_page_with_a_marker_for_each_command() -> None:
    paths = flags.command_paths()
    assert len(paths) >= 20 and "tokenmill produce" in paths and "tokenmill dev up" in paths
    markers = _markers()
    for path in paths:
        group = path.split()[1]
        page = f"commands/{group}.md"
        assert (DOCS / page).is_file(), f"no page {page} for {path}"
        assert page in markers.get(path, []), f"{page} has no <!-- flags: {path} --> marker"
        assert page in NAV.read_text(), f"{page} is not in mkdocs.yml's nav"


def test_every_marker_names_a_command_and_renders_a_row_per_flag() -> None:
    shared = {option.flag for option in OPTIONS}
    for path in _markers():
        table = flags.render(path, "commands/x.md")
        command = _command(path)
        own = [p for p in command.params if not shared.intersection(p.opts)]
        for param in own:
            name = param.opts[0] if isinstance(param, click.Option) else param.name.upper()
            assert f"`{name}" in table, f"{path}: {name} is not in its table"
        rows = [line for line in table.splitlines() if line.startswith("| `")]
        assert len(rows) == len(own), path
        if not own:
            assert "no flags of its own" in table


def test_a_table_carries_type_default_and_help_from_the_command() -> None:
    table = flags.render("tokenmill consume", "commands/consume.md")
    row = next(line for line in table.splitlines() if line.startswith("| `--commit-interval`"))
    assert "`2`" in row and "Seconds between transactions." in row and "0.05<=x<=5.0" in row
    assert "| `--run` | text | required |" in table
    assert "env `TOKENMILL_SGLANG_URL`" in table
    assert "&lt;hostname&gt;" in table  # help text is escaped, not taken as HTML
    assert "`--bootstrap-servers`" not in table  # shared settings live on one page
    assert "[shared settings](../configuration.md#shared-settings)" in table
    sink = flags.render("tokenmill sink", "commands/sink.md")
    assert "| `--create-bucket/--no-create-bucket` | flag | only on a loopback endpoint |" in sink


def test_the_shared_settings_table_lists_every_setting_with_its_variable() -> None:
    table = flags.render_settings()
    for option in OPTIONS:
        assert f"| `{option.flag}` | `{option.env}` |" in table
    assert "<!-- settings -->" in (DOCS / "configuration.md").read_text()


@pytest.mark.parametrize("path", ["tokenmill nosuch", "tokenmill produce extra",
                                  "tokenmill dev", "produce", "tokenmill runs lst"])
def test_a_marker_naming_no_command_fails(path: str) -> None:
    with pytest.raises(flags.MarkerError):
        flags.render(path)
    with pytest.raises(flags.MarkerError):
        flags.expand(f"intro\n<!-- flags: {path} -->\n", "commands/x.md")


def test_markers_are_replaced_and_the_rest_of_the_page_kept() -> None:
    page = "# t\n\nprose\n\n<!-- flags: tokenmill runs show -->\n\nmore prose\n"
    out = flags.expand(page, "commands/runs.md")
    assert "<!-- flags:" not in out and out.startswith("# t\n\nprose\n")
    assert "`RUN_ID`" in out and out.endswith("\nmore prose\n")


def test_the_home_page_is_the_readme_with_its_links_made_relative() -> None:
    body = flags.expand("# tokenmill\n\n<!-- readme -->\n", "index.md")
    assert "## The two commands" in body and "](docs/" not in body
    assert "](guarantees.md#published-once-per-run)" in body
    assert re.search(r"\]\(commands/produce\.md\)", body)
