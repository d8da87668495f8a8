"""Multi-turn policies and prompt categories.

A conversation from a dataset usually ends with the assistant's answer. The
producer keeps context up to a user turn; the model generates what follows.

- `last-user` (default): everything up to and including the last user turn.
  The final assistant turn, with any tool calls it made and their results, is
  what gets regenerated: the model makes its own calls.
- `strip-assistant`: system and user turns only, up to the last user turn
  (what the seed run did; tool results go with the assistant turns).
- `per-user-turn`: one prompt per user turn, each with all the context before
  it (assistant turns and tool results included); `turn` is the user-turn index.
"""

from __future__ import annotations

from collections.abc import Sequence

from producer.rejects import Reject
from schemas.messages import Message, Tool
from schemas.prompt import Category
from schemas.run import MultiTurnPolicy

Prompt = tuple[tuple[Message, ...], int | None]  # (messages, user-turn index)


def user_positions(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.role == "user"]


def apply_policy(messages: tuple[Message, ...], policy: MultiTurnPolicy) -> list[Prompt]:
    """The prompts one conversation yields; Reject if nothing is left to generate."""
    users = user_positions(messages)
    if not users:
        raise Reject("no-user-turn", "no user turn: nothing to generate")
    if policy == "per-user-turn":
        prompts = [(messages[: pos + 1], turn) for turn, pos in enumerate(users)]
    elif policy == "strip-assistant":
        kept = tuple(m for m in messages[: users[-1] + 1] if m.role in ("system", "user"))
        prompts = [(kept, None)]
    else:
        prompts = [(messages[: users[-1] + 1], None)]
    for kept, turn in prompts:
        last = kept[-1].content
        if not last or not last.strip():
            where = f"user turn {turn}" if turn is not None else "the last user turn"
            raise Reject("empty-prompt", f"{where} is empty")
    return prompts


def category(messages: Sequence[Message], tools: tuple[Tool, ...] | None,
             tool_text: bool) -> Category:
    """tools > multi-turn > system-prompt > plain, judged on the kept context."""
    if tools or tool_text or any(m.role == "tool" or m.tool_calls for m in messages):
        return "tools"
    users = 0
    system = False
    for m in messages:
        if m.role == "user":
            users += 1
        elif m.role == "system":
            system = True
    if users > 1:
        return "multi-turn"
    return "system-prompt" if system else "plain"


def user_turns(messages: Sequence[Message]) -> int:
    return sum(1 for m in messages if m.role == "user")
