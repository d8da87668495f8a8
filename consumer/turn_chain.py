"""What a worker reads, sends and commits for a run: the one place that
knows whether the run chains turns.

A plain run reads prompts, sends each as it is and commits its completion to
`.completions`. A `regenerate-turns` run also reads `tokenmill.<run>.turns`
(same group): each input is one step of a conversation (consumer/turns.py),
and what the step commits, in the transaction that commits its input
offset, is the next turn (to `.turns`) or the finished conversation (to
`.completions`); so each step is generated once and any worker can take the
next one.
"""

from __future__ import annotations

from consumer.partitions import Input, Output
from consumer.turns import advance, dataset_answerer, position_of
from consumer.validation import check_prompt, check_turn, topic_run
from schemas import Conversation, PromptRecord, RunSpec
from schemas.completion import CompletionRecord
from schemas.turn import TurnRecord
from tokenmill.kafka import topics
from tokenmill.registry import source_prompts_topic
from tokenmill.tool_results import ToolResultsHook, load_hook


class TurnChain:
    """Parameters: `spec` (the run; its tool-results hook is loaded here and
    raises HookUnavailable when it cannot be)."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.prompts_topic = source_prompts_topic(spec)
        self.completions_topic = topics.completions_topic(spec.run_id)
        # regenerate-turns: conversations between turns, read and written here.
        self.turns_topic = (topics.turns_topic(spec.run_id)
                            if spec.multi_turn == "regenerate-turns" else None)
        self.input_topics = (self.prompts_topic,) + (
            (self.turns_topic,) if self.turns_topic else ())
        self._topic_owner = topic_run(self.prompts_topic)
        self._tool_hook: ToolResultsHook | None = (
            load_hook(spec.tool_results) if spec.tool_results else None)

    @property
    def chained(self) -> bool:
        return self.turns_topic is not None

    def what(self, topic: str) -> str:
        """How logs name a record of `topic`."""
        return "turn" if topic == self.turns_topic else "prompt"

    def check(self, topic: str, value: bytes | None) -> Input | str:
        """The input a record of `topic` holds, or what is wrong with it."""
        if topic == self.turns_topic:
            return check_turn(value, self.spec)
        return check_prompt(value, self._topic_owner)

    def request(self, item: Input) -> PromptRecord:
        """What to send the server for `item`: the prompt, or the transcript
        of the conversation so far."""
        if self.chained:
            return position_of(item).request()
        assert isinstance(item, PromptRecord), "a turn record in a run without turns"
        return item

    def output(self, item: Input, record: CompletionRecord) -> Output:
        """What `item`'s result commits: the record itself, or the
        conversation's next move after this step."""
        if not self.chained:
            return record
        assert not isinstance(record, Conversation)
        at = position_of(item)
        return advance(at, record, dataset_answerer(at.prompt, self._tool_hook))

    def topic_of(self, record: Output) -> str:
        """Where a committed output goes: the next turn to `.turns`, the rest
        to `.completions`."""
        if isinstance(record, TurnRecord):
            assert self.turns_topic is not None
            return self.turns_topic
        return self.completions_topic
