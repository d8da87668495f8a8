"""Prompt token estimate: no tokenizer here, so a documented, deterministic rule.

Rule (roughly a Qwen chat template with a BPE of ~4 characters per token):

* each message costs ``ceil(chars / 4) + MESSAGE_OVERHEAD`` tokens, where
  ``chars`` is the length of its text content (string content, or the ``text``
  of its content parts) plus the length of the JSON of its ``tool_calls``;
  the overhead stands for ``<|im_start|>role\\n ... <|im_end|>\\n``;
* the assistant generation prompt adds ``GENERATION_PROMPT`` tokens;
* structured ``tools`` add ``ceil(len(json(tools)) / 4) + TOOLS_OVERHEAD``
  (the template's tool preamble).

The estimate only grows when text is added (tested as a property), which is
all the context-length checks and the cache report need.
"""

from __future__ import annotations

MESSAGE_OVERHEAD = 4
GENERATION_PROMPT = 3
TOOLS_OVERHEAD = 40
CHARS_PER_TOKEN = 4


def text_tokens(chars: int) -> int:
    """ceil(chars / 4) without floats."""
    return -(-chars // CHARS_PER_TOKEN)


def message_tokens(chars: int) -> int:
    """Tokens of one rendered message with `chars` characters of content."""
    return text_tokens(chars) + MESSAGE_OVERHEAD


def tools_tokens(tools_json_chars: int) -> int:
    """Tokens the tool definitions add to the system turn (0 without tools)."""
    if tools_json_chars <= 0:
        return 0
    return text_tokens(tools_json_chars) + TOOLS_OVERHEAD


def prompt_tokens(message_chars: list[int], tools_json_chars: int = 0) -> int:
    """Whole-prompt estimate from per-message character counts."""
    return (
        sum(message_tokens(c) for c in message_chars)
        + tools_tokens(tools_json_chars)
        + GENERATION_PROMPT
    )


def prefix_tokens(message_chars: list[int], tools_json_chars: int, upto: int) -> int:
    """Tokens of the first `upto` messages (tools sit in the first turn)."""
    return sum(message_tokens(c) for c in message_chars[:upto]) + tools_tokens(tools_json_chars)
