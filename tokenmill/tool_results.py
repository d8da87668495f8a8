"""The `--tool-results module:function` hook: answers generated tool calls
before the dataset's recorded results are looked at.

The function is called as `function(call: ToolCall, prompt: PromptRecord)`
and returns the result text, or None to fall back to the dataset. It must be
deterministic (a redone step must see the same result) and fast: it runs on
the worker's event loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from schemas import PromptRecord, ToolCall

ToolResultsHook = Callable[[ToolCall, PromptRecord], "str | None"]


class HookUnavailable(ValueError):
    """The hook named in the run spec cannot be imported."""


def load_hook(path: str) -> ToolResultsHook:
    module_name, _, function_name = path.partition(":")
    if not module_name or not function_name:
        raise HookUnavailable(f"--tool-results {path!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise HookUnavailable(f"--tool-results {path!r}: cannot import {module_name}: {exc}"
                              ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise HookUnavailable(f"--tool-results {path!r}: {module_name} has no function "
                              f"{function_name}")
    hook: ToolResultsHook = function  # callable; its signature is the hook's contract
    return hook
