"""MkDocs hook: the manual's flag tables, generated from the click commands.

A page that holds `<!-- flags: tokenmill produce -->` gets, in its place, the
table of that command's flags (flag, what it takes, default, help), read from
the command object itself (`tokenmill.cli.cli`, walked through its lazy
sub-groups), so `--help` and the manual cannot drift apart. The shared
settings (`--bootstrap-servers`, `--s3-bucket`, ...) are one table of their
own, `<!-- settings -->`, on the configuration page; command tables leave
them out and link there.

`<!-- readme -->` on the home page includes README.md (without its title),
its links into `docs/` made relative to the site.

A marker naming no command, or a group, stops the build. The functions
below are plain Python (no MkDocs import at module level), so the tests
call them directly (tests/install/test_docs_pages.py).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parents[2]
FLAGS = re.compile(r"<!-- flags: ([^>]*?) -->")
SETTINGS = "<!-- settings -->"
README = "<!-- readme -->"
CONFIGURATION = "configuration.md"

# "[default: X]" / "[env: X]" written into a help text by hand
_BRACKETED = re.compile(r"\s*\[(default|env): ([^\]]*)\]")
_NAMES = {"str": "text", "int": "integer", "float": "number", "bool": "flag",
          "integer range": "integer", "float range": "number"}


class MarkerError(ValueError):
    """A marker that names no command, or a group."""


def _root() -> click.Group:
    from tokenmill.cli import cli

    return cli


def command_at(path: str) -> click.Command:
    """The click command `path` names ("tokenmill runs redrive"); a MarkerError
    when there is none, or when it is a group."""
    words = path.split()
    if not words or words[0] != "tokenmill":
        raise MarkerError(f"{path!r}: a command path starts with 'tokenmill'")
    command: click.Command = _root()
    for word in words[1:]:
        if not isinstance(command, click.Group):
            raise MarkerError(f"{path!r}: {command.name!r} has no subcommands")
        sub = command.get_command(click.Context(command), word)
        if sub is None:
            raise MarkerError(f"{path!r}: no command {word!r}")
        command = sub
    if isinstance(command, click.Group):
        raise MarkerError(f"{path!r} is a group: name one of its commands "
                          f"({', '.join(command.list_commands(click.Context(command)))})")
    return command


def command_paths() -> list[str]:
    """Every command that is not a group, as "tokenmill <words>"."""
    found: list[str] = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, f"{path} {name}")
        else:
            found.append(path)

    walk(_root(), "tokenmill")
    return found


def _shared_flags() -> set[str]:
    from tokenmill.settings import OPTIONS

    return {option.flag for option in OPTIONS}


def _cell(text: str) -> str:
    """One table cell on one line; outside `code`, the characters Markdown
    would take as a cell border, HTML or emphasis (`<hostname>`) escaped."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):  # outside code spans (inside, a pipe is text)
        parts[i] = (parts[i].replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", "\\*"))
    return "`".join(parts)


def _number(value: object) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flag(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        name = (param.metavar or param.name or "").upper()
        return f"`{name}...`" if param.nargs == -1 else f"`{name}`"
    names = sorted(param.opts, key=len)
    if param.secondary_opts:
        return ", ".join(f"`{name}/{other}`" for name, other in zip(names, param.secondary_opts))
    return ", ".join(f"`{name}`" for name in names)


def _takes(param: click.Parameter) -> str:
    kind = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(kind, click.Choice):
        return "one of " + ", ".join(f"`{choice}`" for choice in kind.choices)
    name = _NAMES.get(kind.name, kind.name)
    if isinstance(kind, click.Path):
        name = "directory" if kind.dir_okay and not kind.file_okay else "path"
    if "|" in name:  # "str|none": a value, or the word none
        name = " or ".join(f"`{part}`" if part == "none" else _NAMES.get(part, part)
                           for part in name.split("|"))
    if isinstance(kind, click.IntRange | click.FloatRange) and not (
            kind.min is None and kind.max is None):
        name += f" (`{kind._describe_range()}`)"
    if isinstance(param, click.Argument) and param.nargs == -1:
        name += ", one or more"
    return name


def _default(param: click.Parameter, written: dict[str, str]) -> str:
    parts: list[str] = []
    show = getattr(param, "show_default", None)
    default = param.default
    unset = default is None or repr(default) == "Sentinel.UNSET"
    if param.required:
        parts.append("required")
    elif isinstance(show, str):
        parts.append(show)
    elif "default" in written:
        parts.append(written["default"])
    elif isinstance(param, click.Option) and param.is_flag:
        parts.append("-" if default is None else ("on" if default is True else "off"))
    elif not unset and default != "":
        parts.append(f"`{_number(default)}`")
    else:
        parts.append("-")
    env = getattr(param, "envvar", None) or written.get("env")
    if env:
        parts.append(f"env `{env}`")
    return ", ".join(parts)


def _help(param: click.Parameter) -> tuple[str, dict[str, str]]:
    text = getattr(param, "help", None) or ""
    written = {key: value for key, value in _BRACKETED.findall(text)}
    return _BRACKETED.sub("", text).strip(), written


def rows(path: str) -> list[tuple[str, str, str, str]]:
    """(flag, takes, default, help) for each of the command's own parameters."""
    shared = _shared_flags()
    found = []
    for param in command_at(path).params:
        if getattr(param, "hidden", False) or shared.intersection(param.opts):
            continue
        help_text, written = _help(param)
        found.append((_flag(param), _takes(param), _default(param, written), help_text))
    return found


def takes_shared_settings(path: str) -> bool:
    shared = _shared_flags()
    return any(shared.intersection(param.opts) for param in command_at(path).params)


def render(path: str, page: str = "commands/x.md") -> str:
    """The Markdown for `<!-- flags: path -->` on the page at `page` (its
    path under docs/, for the link to the shared settings)."""
    command = command_at(path)
    summary = _cell(command.get_short_help_str(limit=300))
    lines = [f"`{path}`: {summary}", ""]
    table = rows(path)
    if table:
        lines += ["| flag | takes | default | what |", "| --- | --- | --- | --- |"]
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table]
    else:
        lines.append("It takes no flags of its own.")
    if takes_shared_settings(path):
        link = posixpath.relpath(CONFIGURATION, posixpath.dirname(page) or ".")
        lines += ["", f"Also the [shared settings]({link}#shared-settings)."]
    return "\n".join(lines)


def render_settings() -> str:
    """The shared settings: flag, environment variable, default, help."""
    from tokenmill.settings import OPTIONS, Settings

    defaults = Settings.__struct_defaults__
    fields = dict(zip(Settings.__struct_fields__[-len(defaults):], defaults, strict=True))
    lines = ["| flag | environment | default | what |", "| --- | --- | --- | --- |"]
    for option in OPTIONS:
        value = fields.get(option.name)
        if option.name == "state_dir":
            shown = "`.tokenmill`"
        elif value is None or repr(value).startswith("<"):
            shown = "-"
        elif value == "":
            shown = "empty"
        else:
            shown = f"`{_number(value)}`"
        lines.append(f"| `{option.flag}` | `{option.env}` | {shown} | {_cell(option.help)} |")
    return "\n".join(lines)


def expand(markdown: str, page: str) -> str:
    """Every marker of a page replaced (a MarkerError for a bad one)."""
    text = FLAGS.sub(lambda m: render(m.group(1).strip(), page), markdown)
    if SETTINGS in text:
        text = text.replace(SETTINGS, render_settings())
    if README in text:
        text = text.replace(README, readme_body(page))
    return text


def readme_body(page: str = "index.md") -> str:
    """README.md without its title line, links into docs/ made relative to
    `page`."""
    body = (ROOT / "README.md").read_text().split("\n", 1)[1]
    base = posixpath.dirname(page) or "."

    def relink(match: re.Match[str]) -> str:
        return f"]({posixpath.relpath(match.group(1), base)}"

    return re.sub(r"\]\(docs/([^)#\s]*)", relink, body)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    from mkdocs.exceptions import PluginError

    try:
        return expand(markdown, page.file.src_uri)
    except MarkerError as exc:
        raise PluginError(f"{page.file.src_uri}: {exc}") from None
