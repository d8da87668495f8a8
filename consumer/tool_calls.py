"""Generated tool calls: are they well-formed, and what did the dataset
answer to the same call (pure).

A call is valid when its arguments parse as a JSON object, it names one of
the offered tools, and the arguments satisfy that tool's JSON Schema
(`parameters`). A tool whose schema is itself not valid JSON Schema cannot
be checked beyond its name: that is the dataset's fault, not the model's.

The dataset answers a call when it recorded a call with the same function
name and equal arguments (parsed, so key order and spacing do not matter)
followed by its result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from schemas.messages import Message, Tool, ToolCall

_MISSING = object()


def parse_arguments(text: str) -> Any:
    """The arguments as JSON, or `_MISSING` when they do not parse."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return _MISSING


def tool_schemas(tools: Iterable[Tool] | None) -> dict[str, dict[str, Any]]:
    """function name -> its parameters schema ({} when it has none)."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            out[function["name"]] = parameters if isinstance(parameters, dict) else {}
    return out


def call_problem(call: ToolCall, schemas: dict[str, dict[str, Any]]) -> str | None:
    """What is wrong with one generated call, or None."""
    name = call.function.name
    arguments = parse_arguments(call.function.arguments)
    if arguments is _MISSING:
        return f"tool call {name!r}: arguments are not JSON: {call.function.arguments[:200]!r}"
    if not isinstance(arguments, dict):
        return f"tool call {name!r}: arguments are not a JSON object"
    if name not in schemas:
        return f"tool call {name!r}: not one of the offered tools {sorted(schemas)}"
    # Imported here: a tenth of a worker's start-up, and only tool calls need it.
    import jsonschema

    try:
        jsonschema.validate(arguments, schemas[name])
    except jsonschema.SchemaError:
        return None
    except jsonschema.ValidationError as exc:
        return f"tool call {name!r}: arguments violate its schema: {exc.message[:300]}"
    return None


def calls_problem(calls: Iterable[ToolCall], tools: Iterable[Tool] | None) -> str | None:
    """The first problem among a step's calls, or None when all are valid."""
    schemas = tool_schemas(tools)
    for call in calls:
        problem = call_problem(call, schemas)
        if problem is not None:
            return problem
    return None


def recorded_results(dataset: tuple[Message, ...]) -> list[tuple[str, Any, str]]:
    """(function name, parsed arguments, result text) of every call the
    dataset conversation made and answered. A tool message is matched to its
    call by `tool_call_id`, else by position after the calling message."""
    out: list[tuple[str, Any, str]] = []
    for i, message in enumerate(dataset):
        if message.role != "assistant" or not message.tool_calls:
            continue
        answers: list[Message] = []
        for later in dataset[i + 1:]:
            if later.role != "tool":
                break
            answers.append(later)
        by_id = {a.tool_call_id: a for a in answers if a.tool_call_id}
        for position, call in enumerate(message.tool_calls):
            answer = by_id.get(call.id) if call.id else None
            if answer is None and not by_id and position < len(answers):
                answer = answers[position]
            if answer is not None:
                out.append((call.function.name, parse_arguments(call.function.arguments),
                            answer.content or ""))
    return out


def dataset_answer(call: ToolCall, recorded: list[tuple[str, Any, str]]) -> str | None:
    """The recorded result of the same call (same name, equal arguments)."""
    arguments = parse_arguments(call.function.arguments)
    for name, recorded_arguments, result in recorded:
        if name == call.function.name and recorded_arguments == arguments:
            return result
    return None


def tool_message(call: ToolCall, result: str) -> Message:
    return Message(role="tool", content=result, tool_call_id=call.id or None,
                   name=call.function.name)
