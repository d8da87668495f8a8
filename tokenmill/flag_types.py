"""click parameter types the commands share: numbers that must be finite and
within bounds, ports, and names with a fixed alphabet.

click's `FloatRange` lets `nan` through every bound (comparisons with NaN are
false) and `inf` through an open upper end; a timeout of NaN seconds or a
rate of infinity is never what the user meant, so these refuse them with the
usual one-line usage error naming the flag.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from schemas.run import RUN_ID_PATTERN


class FiniteFloat(click.FloatRange):
    """A `click.FloatRange` that also refuses nan and inf."""

    name = "number"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def seconds(minimum: float = 0.0, maximum: float | None = None, *,
            min_open: bool = True) -> FiniteFloat:
    """A duration flag: finite, above `minimum` (or at least it, when
    `min_open` is False), at most `maximum`."""
    return FiniteFloat(minimum, maximum, min_open=min_open)


PORT = click.IntRange(1, 65535)
PORT_OR_OFF = click.IntRange(0, 65535)  # 0: off / any free port, as the flag says


class Pattern(click.ParamType):  # type: ignore[type-arg,unused-ignore]
    """A string matching a regular expression; `what` says the rule in words."""

    name = "text"

    def __init__(self, pattern: str, what: str) -> None:
        self.pattern = re.compile(pattern)
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if value is None or self.pattern.fullmatch(str(value)):
            return value
        self.fail(f"{value!r}: {self.what}", param, ctx)


HEAP = Pattern(r"[1-9][0-9]*[kmgKMG]?", "expected a JVM heap size like 768m or 1g")


class TopK(click.IntRange):
    """SGLang's top_k: -1 (off) or at least 1."""

    name = "integer"

    def __init__(self) -> None:
        super().__init__(min=-1)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number == 0:
            self.fail("0 is not a valid top-k: use -1 (off) or at least 1", param, ctx)
        return number


RUN_ID = Pattern(RUN_ID_PATTERN.pattern,
                 "a run id is 1-100 letters, digits, '_' or '-', starting with a letter or digit")
