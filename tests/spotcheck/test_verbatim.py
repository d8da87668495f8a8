"""ops/verbatim.py: dataset text is shown as it is, never acted on."""

from __future__ import annotations

import io
import re
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ops.verbatim import ELLIPSIS, escape_char, excerpt, visible

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def test_markup_and_brackets_are_kept() -> None:
    for text in ("<s>[INST] hi [/INST]", "[general] this that", "[bold]x[/bold]", ":smile:",
                 "[/]", "a \\x1b b"):
        assert visible(text) == text
        assert excerpt(text, 100) == text


def test_control_characters_are_escaped() -> None:
    assert visible("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert visible("a\x00b\x07c\x7fd\x85e\x9bf") == "a\\x00b\\x07c\\x7fd\\x85e\\x9bf"
    assert visible("new\nline\ttab\r") == "new\\x0aline\\x09tab\\x0d"
    assert visible("abc\u202edcba") == "abc\\u202edcba"


def test_lone_surrogates_are_escaped() -> None:
    assert visible("x\ud800y\udcffz") == "x\\ud800y\\udcffz"
    assert visible("\ud800").encode("utf-8") == b"\\ud800"


def test_excerpt_flattens_whitespace_and_cuts_with_an_ellipsis() -> None:
    assert excerpt("  a\n\n b\t c  ", 100) == "a b c"
    assert excerpt(None, 10) == "-" and excerpt("  \n", 10) == "-"
    assert excerpt("x" * 50, 10) == "x" * 9 + ELLIPSIS
    assert excerpt("x" * 10, 10) == "x" * 10


def test_excerpt_never_cuts_an_escape_in_half() -> None:
    # "ab" + "\x1b" escaped is 2 + 4 characters: only "ab" fits before the ellipsis.
    assert excerpt("ab\x1bcdef", 6) == "ab" + ELLIPSIS
    assert excerpt("ab\x1bcdef", 7) == "ab\\x1b" + ELLIPSIS


def test_excerpt_refuses_a_width_below_one() -> None:
    with pytest.raises(ValueError):
        excerpt("x", 0)


def test_escape_char_uses_the_short_form_for_latin1() -> None:
    assert escape_char("\x1b") == "\\x1b"
    assert escape_char("\u2028") == "\\u2028"


def _printable(text: str) -> bool:
    return not any(unicodedata.category(c) in ("Cc", "Cs") or c in BIDI
                   or c in "\u2028\u2029" for c in text)


@given(st.text(max_size=300))
def test_output_is_always_safe(text: str) -> None:
    for shown in (visible(text), excerpt(text, 40)):
        assert UNSAFE.search(shown) is None
        shown.encode("utf-8")  # strict: raises on a lone surrogate
        assert not any(unicodedata.category(c) == "Cc" for c in shown)
    assert len(excerpt(text, 40)) <= 40


@given(st.text(max_size=300).filter(_printable))
def test_printable_text_is_kept_verbatim(text: str) -> None:
    assert visible(text) == text
    flat = " ".join(text.split())
    if flat and len(flat) <= 300:
        assert excerpt(text, 300) == flat


@given(st.text(max_size=200))
def test_an_excerpt_is_a_prefix_of_the_visible_text(text: str) -> None:
    shown = excerpt(text, 30)
    whole = visible(" ".join(text.split()))
    if shown.endswith(ELLIPSIS) and len(whole) > 30:
        assert whole.startswith(shown[:-1])
    elif whole:
        assert shown == whole


@given(st.text(max_size=200))
def test_rich_prints_it_as_given(text: str) -> None:
    """Through a rich Table as Text: no markup error, nothing dropped."""
    shown = excerpt(text, 1000)
    console = Console(file=io.StringIO(), width=2000, color_system=None)
    table = Table()
    table.add_column("value")
    table.add_row(Text(shown))
    console.print(table)
    assert shown.strip() in console.file.getvalue()  # type: ignore[attr-defined]
