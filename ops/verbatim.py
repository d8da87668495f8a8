"""Dataset text made safe to print, without changing what it says (pure).

Operator commands print text straight from datasets and model answers. Such
text holds things a terminal or rich would act on: `[/INST]` and `[general]`
(rich markup: a crash or silently dropped words), ANSI escapes like
`\\x1b[31m` (they recolour or move the cursor), other control characters,
bidirectional overrides (they reorder what is shown) and lone surrogates
(printing them raises UnicodeEncodeError). `visible` shows each of those
characters as a backslash escape and keeps every other character as it is;
render the result with `rich.text.Text`, which never parses markup.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, line/paragraph separators, bidi embeddings,
# overrides and isolates, and surrogates (only ever lone in a str).
_UNSAFE = re.compile("([\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff])")
ELLIPSIS = "…"
EMPTY = "-"


def escape_char(char: str) -> str:
    """One unsafe character as the escape Python's repr would use."""
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every unsafe character escaped, the rest unchanged."""
    return _UNSAFE.sub(lambda m: escape_char(m.group(1)), text)


def excerpt(text: str | None, width: int) -> str:
    """One line of at most `width` characters: whitespace runs become one
    space, unsafe characters are escaped, and a cut is marked with `…`. An
    escape is never cut in half. None or blank text shows as `-`."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    flat = " ".join((text or "").split())
    if not flat:
        return EMPTY
    shown = visible(flat)
    if len(shown) <= width:
        return shown
    room = width - 1
    out: list[str] = []
    # re.split with a group alternates plain runs (even) and unsafe chars (odd).
    for index, part in enumerate(_UNSAFE.split(flat)):
        piece = part if index % 2 == 0 else escape_char(part)
        if len(piece) > room:
            if index % 2 == 0:
                out.append(piece[:room])
            break
        out.append(piece)
        room -= len(piece)
    return "".join(out) + ELLIPSIS
