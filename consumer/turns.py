"""The next move of a `regenerate-turns` conversation after one step (pure).

A step's result decides what the worker commits, in the transaction that
also commits the step's input offset:

- a failure: the conversation is dead-lettered (`Failure` naming the step);
- tool calls: checked (consumer/tool_calls.py); an invalid one is a
  `Failure` of kind `invalid_tool_call`; answered ones are spliced in and the
  same user turn goes on (a `TurnRecord`); an unanswered one ends the
  conversation as `tool_unresolved`;
- an answer with user turns left: the next turn (a `TurnRecord`);
- anything else: the finished `Conversation` (the sink's QA looks at every
  step, so a `length` answer mid-way is dead-lettered there).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from consumer.tool_calls import calls_problem, dataset_answer, recorded_results, tool_message
from schemas import Completion, Conversation, Failure, PromptRecord, Step, ToolCall
from schemas.messages import Message
from schemas.prompt import Resume
from schemas.turn import TurnRecord
from tokenmill.conversation import transcript, user_turns

# Tool-call rounds one user turn may take before the conversation stops.
MAX_TOOL_ROUNDS = 8

# Answers a call: the result text, or None when nobody knows it.
Answerer = Callable[[ToolCall], "str | None"]

Next = TurnRecord | Conversation | Failure


class Position(msgspec.Struct, frozen=True):
    """Where a conversation stands before a step: what the worker read."""

    prompt: PromptRecord
    steps: tuple[Step, ...] = ()
    turn: int = 0

    @property
    def step(self) -> int:
        return len(self.steps)

    def request(self) -> PromptRecord:
        """The step's request as a prompt: the transcript so far; its id names
        the step, so every request of a conversation has its own rid."""
        return msgspec.structs.replace(
            self.prompt, id=f"{self.prompt.id}-s{self.step}",
            messages=transcript(self.prompt.messages, self.steps, self.turn))


def position_of(item: PromptRecord | TurnRecord) -> Position:
    """A turn record's position; a prompt's start, or (a redrive
    `--from-failed-turn`) the failed step it resumes at, after the steps it
    carries. The resume itself is not part of the conversation's prompt."""
    if isinstance(item, TurnRecord):
        return Position(item.prompt, item.steps, item.next_turn)
    resume = item.resume
    if isinstance(resume, Resume):
        return Position(msgspec.structs.replace(item, resume=msgspec.UNSET), resume.steps,
                        resume.next_turn)
    return Position(item)


def step_of(completion: Completion, turn: int) -> Step:
    return Step(turn=turn, finish_reason=completion.finish_reason, content=completion.content,
                reasoning_content=completion.reasoning_content,
                tool_calls=completion.tool_calls, matched_stop=completion.matched_stop,
                usage=completion.usage, spec=completion.spec, latency_s=completion.latency_s,
                attempts=completion.attempts, instance=completion.instance,
                model=completion.model)


def tool_rounds(steps: tuple[Step, ...], turn: int) -> int:
    return sum(1 for s in steps if s.turn == turn and s.tool_results)


def dataset_answerer(prompt: PromptRecord,
                     hook: Callable[[ToolCall, PromptRecord], str | None] | None = None
                     ) -> Answerer:
    """The hook first (when the run names one), then the dataset's record
    (gathered at the first call: most steps call no tool)."""
    recorded: list[tuple[str, object, str]] | None = None

    def answer(call: ToolCall) -> str | None:
        nonlocal recorded
        if hook is not None:
            result = hook(call, prompt)
            if result is not None:
                return result
        if recorded is None:
            recorded = recorded_results(prompt.messages)
        return dataset_answer(call, recorded)
    return answer


def tool_answers(calls: tuple[ToolCall, ...], answer: Answerer) -> tuple[Message, ...] | None:
    """One tool message per call, or None if any call stays unanswered."""
    messages = []
    for call in calls:
        result = answer(call)
        if result is None:
            return None
        messages.append(tool_message(call, result))
    return tuple(messages)


def advance(at: Position, result: Completion | Failure, answer: Answerer) -> Next:
    prompt = at.prompt
    if isinstance(result, Failure):
        return msgspec.structs.replace(result, id=prompt.id, prompt=prompt, step=at.step,
                                       steps=at.steps)
    step = step_of(result, at.turn)
    done = at.steps + (step,)
    if step.tool_calls:
        problem = calls_problem(step.tool_calls, prompt.tools)
        if problem is not None:
            return failed(at, result, "invalid_tool_call", problem, done)
        if tool_rounds(at.steps, at.turn) + 1 > MAX_TOOL_ROUNDS:
            return finished(result, prompt, done, "tool_limit")
        try:
            answers = tool_answers(step.tool_calls, answer)
        except Exception as exc:  # noqa: BLE001 - the hook's bug dead-letters the conversation
            return failed(at, result, "tool_hook_error", f"{type(exc).__name__}: {exc}", done)
        if answers is None:
            return finished(result, prompt, done, "tool_unresolved")
        answered = msgspec.structs.replace(step, tool_results=answers)
        return turn_record(result, prompt, at.steps + (answered,), at.turn)
    if result.finish_reason == "stop" and at.turn + 1 < user_turns(prompt.messages):
        return turn_record(result, prompt, done, at.turn + 1)
    return finished(result, prompt, done, "finished")


def turn_record(result: Completion, prompt: PromptRecord, steps: tuple[Step, ...],
                next_turn: int) -> TurnRecord:
    return TurnRecord(id=prompt.id, run=result.run, settings_hash=result.settings_hash,
                      prompt=prompt, steps=steps, next_turn=next_turn)


def finished(result: Completion, prompt: PromptRecord, steps: tuple[Step, ...],
             outcome: str) -> Conversation:
    return Conversation(id=prompt.id, run=result.run, settings_hash=result.settings_hash,
                        prompt=prompt, steps=steps, outcome=outcome)  # type: ignore[arg-type]


def failed(at: Position, result: Completion, kind: str, error: str,
           steps: tuple[Step, ...]) -> Failure:
    return Failure(id=at.prompt.id, run=result.run, settings_hash=result.settings_hash,
                   prompt=at.prompt, failure=kind, error=error[:2000],  # type: ignore[arg-type]
                   attempts=result.attempts, instance=result.instance,
                   latency_s=result.latency_s, step=at.step, steps=steps)
