"""What a `regenerate-turns` conversation looks like as chat messages (pure).

The dataset conversation (`PromptRecord.messages`) gives the system prompt
and the user turns; the generated steps give every assistant message and
the tool results spliced after it. The worker sends `transcript(...)` as
each request and the sink stores it as the finished conversation, so both
read the same definition: turn k's request carries exactly the answers
generated for turns 0..k-1.
"""

from __future__ import annotations

from schemas.completion import Step
from schemas.messages import Message


def user_positions(dataset: tuple[Message, ...]) -> tuple[int, ...]:
    return tuple(i for i, m in enumerate(dataset) if m.role == "user")


def user_turns(dataset: tuple[Message, ...]) -> int:
    return sum(1 for m in dataset if m.role == "user")


def opening(dataset: tuple[Message, ...]) -> tuple[Message, ...]:
    """The system messages before the first user turn."""
    users = user_positions(dataset)
    first = users[0] if users else len(dataset)
    return tuple(m for m in dataset[:first] if m.role == "system")


def assistant_message(step: Step) -> Message:
    """What the model said, as the next request carries it (reasoning is not
    sent back, as chat templates drop earlier turns' thinking)."""
    return Message(role="assistant", content=step.content, tool_calls=step.tool_calls)


def transcript(dataset: tuple[Message, ...], steps: tuple[Step, ...],
               through_turn: int) -> tuple[Message, ...]:
    """System prompt, user turns 0..through_turn and the steps in between.
    With `through_turn` past the last step's turn this is the next request."""
    users = user_positions(dataset)
    out = list(opening(dataset))
    turn = -1
    for step in steps:
        while turn < step.turn:
            turn += 1
            out.append(dataset[users[turn]])
        out.append(assistant_message(step))
        out.extend(step.tool_results)
    while turn < through_turn:
        turn += 1
        out.append(dataset[users[turn]])
    return tuple(out)


def final_transcript(dataset: tuple[Message, ...], steps: tuple[Step, ...]) -> tuple[Message, ...]:
    """The whole conversation: every user turn answered so far and every step."""
    return transcript(dataset, steps, steps[-1].turn if steps else 0)
