"""`tokenmill spot-check --run RUN`: read a few committed results and show
what they really contain (roles of the prompt, reasoning, answer, tool calls,
finish reason). The seed run's operator asked "how did we handle multi-turn?"
and "are tool prompts generated?" - this answers from the data itself."""

from __future__ import annotations

import random

import click
from confluent_kafka import KafkaError, TopicPartition
from rich.console import Console
from rich.table import Table

from schemas import Completion, Failure, decode_completion
from schemas.completion import CompletionRecord
from tokenmill import kafka_clients, topics
from tokenmill.commandline import service_command
from tokenmill.flag_types import RUN_ID
from tokenmill.registry import RunRegistry
from tokenmill.settings import Settings


def _excerpt(text: str | None, width: int) -> str:
    if not text:
        return "-"
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def pick(settings: Settings, run_id: str, n: int, category: str | None, seed: int,
         scan_limit: int = 20_000) -> list[CompletionRecord]:
    """Up to n records of the category, from randomly chosen partitions."""
    topic = topics.completions_topic(run_id)
    consumer = kafka_clients.consumer(settings, f"tokenmill.{run_id}.spot-check",
                                      {"enable.partition.eof": True})
    found: list[CompletionRecord] = []
    try:
        metadata = consumer.list_topics(topic, timeout=settings.connect_timeout_s)
        partitions = list(metadata.topics[topic].partitions)
        random.Random(seed).shuffle(partitions)
        consumer.assign([TopicPartition(topic, p, -2) for p in partitions])
        open_partitions = set(partitions)
        scanned = 0
        while open_partitions and len(found) < n and scanned < scan_limit:
            for message in consumer.consume(200, timeout=1.0):
                if message.error():
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        open_partitions.discard(message.partition())
                    continue
                scanned += 1
                record = decode_completion(message.value())
                if category is None or record.prompt.category == category:
                    found.append(record)
                    if len(found) >= n:
                        break
    finally:
        consumer.close()
    return found


@click.command("spot-check")
@click.option("--run", "run_id", required=True, type=RUN_ID)
@click.option("-n", "count", default=3, show_default=True, type=click.IntRange(1, 100))
@click.option("--category", type=click.Choice(["plain", "multi-turn", "tools", "system-prompt"]),
              default=None, help="Only prompts of this category.")
@click.option("--seed", default=0, show_default=True, help="Which partitions to look at first.")
@click.option("--width", default=100, show_default=True, type=click.IntRange(10, 100_000),
              help="Characters of text to show.")
@service_command
def spot_check(settings: Settings, run_id: str, count: int, category: str | None, seed: int,
               width: int) -> None:
    """Show a few committed results of a run, as they will be stored.

    \b
    Example:
      tokenmill spot-check --run my-run --category multi-turn -n 3
    """
    RunRegistry(settings).get(run_id)
    records = pick(settings, run_id, count, category, seed)
    console = Console()
    if not records:
        console.print(f"no committed results{f' of category {category}' if category else ''} yet")
        return
    for record in records:
        table = Table(title=f"{record.id}  ({record.prompt.category}, {record.prompt.source}:"
                            f"{record.prompt.line}, {record.prompt.format})",
                      show_header=False, expand=True)
        table.add_column("field", style="bold", no_wrap=True)
        table.add_column("value")
        roles = " → ".join(m.role for m in record.prompt.messages)
        table.add_row("prompt turns", f"{roles} → [green]assistant (generated)[/]")
        last_user = next((m.content for m in reversed(record.prompt.messages)
                          if m.role == "user"), None)
        table.add_row("last user turn", _excerpt(last_user, width))
        if record.prompt.tools:
            names = [t.get("function", {}).get("name", "?") for t in record.prompt.tools]
            table.add_row("tools offered", ", ".join(names))
        if isinstance(record, Failure):
            table.add_row("failure", f"[red]{record.failure}[/]: {_excerpt(record.error, width)}")
        else:
            assert isinstance(record, Completion)
            table.add_row("reasoning", _excerpt(record.reasoning_content, width))
            table.add_row("answer", _excerpt(record.content, width))
            if record.tool_calls:
                table.add_row("tool calls", "; ".join(
                    f"{c.function.name}({_excerpt(c.function.arguments, 60)})"
                    for c in record.tool_calls))
            table.add_row("finish", f"{record.finish_reason}  ({record.usage.completion_tokens} "
                                    f"tokens, {record.usage.reasoning_tokens} reasoning)")
        console.print(table)
