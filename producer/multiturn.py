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
- `regenerate-turns`: one prompt holding the whole dataset conversation; the
  workers send its system prompt and user turns one at a time, each with the
  model's own earlier answers (consumer/turns.py), and splice in the
  dataset's tool results where the model makes the same call. Its assistant
  turns are never sent.
"""

from __future__ import annotations

from typing import NamedTuple

from producer.formats import Normalized
from producer.rejects import Reject
from schemas.messages import Message, Tool
from schemas.prompt import Category
from schemas.run import MultiTurnPolicy


class Prompt(NamedTuple):
    messages: tuple[Message, ...]
    turn: int | None  # user-turn index (per-user-turn policy only)
    category: Category
    user_turns: int  # user turns in the kept context


_new = tuple.__new__  # builds a NamedTuple without its slower keyword-aware __new__


def apply_policy(conversation: Normalized, policy: MultiTurnPolicy) -> list[Prompt]:
    """The prompts one conversation yields; Reject if nothing is left to generate."""
    messages, tools, _, tool_text, users, first_tool, first_system = conversation
    if not users:
        raise Reject("no-user-turn", "no user turn: nothing to generate")
    has_tools = bool(tools) or tool_text
    last = users[-1]
    if policy == "last-user":  # the default, kept short: category() inlined
        kept = messages if last == len(messages) - 1 else messages[: last + 1]
        count = len(users)
        cat: Category = ("tools" if has_tools or first_tool < last else
                         "multi-turn" if count > 1 else
                         "system-prompt" if first_system < last else "plain")
        content = kept[-1].content
        if not content or content.isspace():
            raise Reject("empty-prompt", "the last user turn is empty")
        return [_new(Prompt, (kept, None, cat, count))]
    elif policy == "regenerate-turns":
        prompts = [_new(Prompt, (messages, None,
                                 category(has_tools, first_tool < len(messages), len(users),
                                          first_system < last), len(users)))]
        for turn, pos in enumerate(users):
            content = messages[pos].content
            if not content or content.isspace():
                raise Reject("empty-prompt", f"user turn {turn} is empty")
        return prompts
    elif policy == "per-user-turn":
        prompts = [_new(Prompt, (messages[: pos + 1], turn,
                                 category(has_tools, first_tool < pos, turn + 1,
                                          first_system < pos), turn + 1))
                   for turn, pos in enumerate(users)]
    else:  # strip-assistant
        kept = tuple(m for m in messages[: last + 1] if m.role == "system" or m.role == "user")
        prompts = [_new(Prompt, (kept, None, category(has_tools, False, len(users),
                                                      first_system < last), len(users)))]
    for prompt in prompts:
        content = prompt[0][-1].content
        if not content or content.isspace():
            where = f"user turn {prompt[1]}" if prompt[1] is not None else "the last user turn"
            raise Reject("empty-prompt", f"{where} is empty")
    return prompts


def category(tools: bool, tool_turns: bool, user_turns: int, system: bool) -> Category:
    """tools > multi-turn > system-prompt > plain, judged on the kept context:
    tool specs (structured or as text), tool calls or results, more than one
    user turn, a system message."""
    if tools or tool_turns:
        return "tools"
    if user_turns > 1:
        return "multi-turn"
    return "system-prompt" if system else "plain"


def category_of(messages: tuple[Message, ...], tools: tuple[Tool, ...] | None,
                tool_text: bool = False) -> Category:
    """The same rule over a plain message list (for readers of published prompts)."""
    return category(bool(tools) or tool_text,
                    any(m.role == "tool" or m.tool_calls for m in messages),
                    sum(1 for m in messages if m.role == "user"),
                    any(m.role == "system" for m in messages))
