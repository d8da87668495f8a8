"""Writes the sample dataset in devstack/sample/ (used by `tokenmill demo`).

Small (about 250 records), varied, in every input shape the producer reads:

- sharegpt_chats.jsonl        ShareGPT: single-turn, system prompts, multi-turn follow-ups
- openai_tool_calls.jsonl     OpenAI messages and request bodies: `tools`, tool calls,
                              tool results, follow-up questions, "Available tools:" prompts
- hermes_function_calling.json  a JSON array in the Hermes format (<tools> in the system
                              prompt, <tool_call> / <tool_response> turns)
- alpaca_instructions.jsonl.gz  Alpaca instruction/input/output, gzip-compressed
- plain_prompts.jsonl         {"prompt": ...}
- messy_records.jsonl         real-world flaws: a malformed line, a conversation with
                              nothing to generate, an unknown role, a duplicate prompt

Deterministic (fixed seed, no clock), so re-running rewrites identical files
(a test checks the committed files are this script's output):

    python devstack/make_sample.py [OUTPUT_DIR]
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "sample"

PLAIN = [
    "Explain why the sky is blue to a curious ten-year-old.",
    "Write a Python function that returns the n-th Fibonacci number in O(log n) time.",
    "What is the difference between a process and a thread?",
    "Summarize the causes of the French Revolution in five bullet points.",
    "Prove that the square root of 2 is irrational.",
    "Draft a polite email asking my landlord to fix a leaking kitchen tap.",
    "How does HTTPS keep a password secret between my browser and a website?",
    "Give me a three-day itinerary for Lisbon on a modest budget.",
    "What are the trade-offs between B-trees and LSM-trees for a database storage engine?",
    "Write a haiku about a server room at night.",
    "Compute the integral of x * e^x from 0 to 1 and show the steps.",
    "Why do we need both a stack and a heap in most programming languages?",
    "Suggest five names for a bakery that specializes in sourdough.",
    "Explain Bayes' theorem with a medical-test example.",
    "What happens, step by step, when I type a URL into a browser and press Enter?",
    "Write a SQL query that returns the top three customers by total order value per country.",
    "Compare the Roman Republic and the Roman Empire in a short table.",
    "How do vaccines train the immune system?",
    "Write a bash one-liner that finds the ten largest files under the current directory.",
    "What is speculative decoding and why does it make LLM inference faster?",
    "Translate 'the early bird catches the worm' into French, Spanish and German.",
    "Explain the CAP theorem and give one real system for each trade-off.",
    "Write a short story opening in which a lighthouse keeper finds a message in a bottle.",
    "How many distinct ways can you climb 10 stairs taking 1 or 2 steps at a time?",
    "What is the time complexity of building a heap from an unsorted array, and why?",
    "Give me a weekly beginner running plan to reach 5 km in eight weeks.",
    "Explain what a Kafka consumer group rebalance is and why it can pause consumption.",
    "Rewrite this sentence to be more concise: 'At this point in time we are not able to'.",
    "What are the main differences between TCP and UDP?",
    "Describe photosynthesis in three sentences.",
    "Implement binary search in Rust and explain the loop invariant.",
    "What should I consider when choosing between PostgreSQL and MongoDB for a new app?",
    "Write a limerick about a cat who learned to code.",
    "Why does ice float on water?",
    "Explain gradient descent with a one-dimensional example.",
    "Give three arguments for and three against a four-day work week.",
    "How do I reverse a linked list in place? Show code in C.",
    "What is the Monty Hall problem and why is switching better?",
    "List the planets of the solar system with one interesting fact each.",
    "Explain the attention mechanism in transformers without using equations.",
    "Write a regular expression that matches ISO 8601 dates like 2024-03-31.",
    "What causes inflation, and how do central banks try to control it?",
    "Plan a vegetarian dinner for six guests with a starter, main course and dessert.",
    "Explain idempotency in REST APIs with an example.",
    "What is the difference between precision and recall?",
    "Write a motivational note for a friend starting a new job tomorrow.",
    "How does a hash map handle collisions?",
    "Explain the Pythagorean theorem and give a real-world use.",
    "Why is exactly-once delivery hard in distributed systems?",
    "Summarize the plot of Hamlet in one paragraph.",
]

ALPACA = [
    ("Classify the sentiment of the review as positive, negative or neutral.",
     "The battery lasts two days, but the screen scratches far too easily."),
    ("Summarize the following paragraph in one sentence.",
     ("Kafka stores records in partitioned, replicated logs. Producers append to the end of a "
      "partition and consumers read at their own pace, tracking their position with offsets.")),
    ("Fix the grammar and spelling.", "Their going too the libary tomorow to studie."),
    ("Translate the text into Italian.", "Where is the nearest train station?"),
    ("Extract every person and city named in the text.",
     "Marie Curie moved from Warsaw to Paris, where she met Pierre Curie."),
    ("Convert the temperature to Fahrenheit.", "37 degrees Celsius"),
    ("Write a product description for the item.",
     "A stainless steel insulated water bottle, 750 ml"),
    ("Give three synonyms for the word.", "resilient"),
    ("Turn the list into a grammatical sentence.", "milk, eggs, flour, sugar"),
    ("Explain what the code does.", "print(sorted(set(words), key=len)[-1])"),
    ("Rewrite the sentence in the passive voice.", "The committee approved the new budget."),
    ("Generate a title for the article.",
     "Researchers found that short walks after meals lower blood sugar spikes."),
    ("Answer the question using the context.",
     "Context: The Nile flows north into the Mediterranean. Question: Where does the Nile end?"),
    ("Identify the logical fallacy.",
     "Everyone I know likes this phone, so it must be the best phone ever made."),
    ("Compute the result and explain each step.", "15% of 240, then add 12"),
    ("Write a SQL query for the request.", "All orders placed in March 2024 over 100 dollars"),
    ("Suggest a better variable name.", "def f(l): return sum(l) / len(l)"),
    ("Classify the email as spam or not spam.",
     "Congratulations! You have won a free cruise. Click here to claim within 24 hours."),
    ("Make the tone of the message more formal.", "hey, can u send me the report asap? thx"),
    ("Write a regular expression for the pattern.", "US ZIP codes, with optional +4 extension"),
    ("Describe the image in the caption for a visually impaired reader.",
     "A golden retriever catching a frisbee on a beach at sunset"),
    ("Create a multiple-choice question from the fact.",
     "Mount Everest is 8,849 metres tall."),
    ("Shorten the text to under 20 words.",
     ("We regret to inform you that due to unforeseen circumstances the meeting scheduled "
      "for Thursday afternoon has been postponed until further notice.")),
    ("Sort the numbers in ascending order.", "42, 7, 19, 3, 88, 23"),
    ("Explain the idiom.", "to bite off more than you can chew"),
    ("Write a unit test for the function.", "def is_even(n): return n % 2 == 0"),
    ("Rate the difficulty of the chess puzzle from 1 to 5 and explain.",
     "White to move and mate in two: Kg6, Qh1 against a lone black king on h8."),
    ("Convert the JSON to YAML.", '{"name": "tokenmill", "partitions": 28, "gpus": 7}'),
    ("Find the bug.", "for i in range(len(xs)): if xs[i] = target: return i"),
    ("Give a one-line definition.", "eventual consistency"),
    ("Write a tweet announcing the event.", "Open-source meetup on stream processing, Friday 6pm"),
    ("List the steps.", "How to change a flat bicycle tyre"),
    ("Paraphrase the sentence.", "The quick brown fox jumps over the lazy dog."),
    ("Determine whether the number is prime.", "221"),
    ("Recommend a book for the reader.",
     "Someone who loved 'The Martian' and wants more hard sci-fi"),
    ("Write a short apology to the customer.",
     "The order arrived a week late and the box was damaged."),
    ("Name the chemical formula.", "table salt"),
    ("Split the task into subtasks.", "Migrate a web app from a single VM to Kubernetes"),
    ("Explain the difference between the two terms.", "latency and throughput"),
    ("Give the antonym.", "scarce"),
]

SYSTEMS = [
    "You are a concise assistant. Answer in as few words as are needed.",
    "You are a patient tutor. Explain step by step and check understanding.",
    "You are a senior software engineer doing a code review. Be direct and specific.",
    "You are a friendly travel agent who knows Europe well.",
    "You are a careful medical information assistant. You do not give diagnoses.",
]

CHATS = [
    ("How do I center a div horizontally and vertically?",
     "Use flexbox: display:flex; justify-content:center; align-items:center on the parent.",
     "And if I have to support very old browsers?"),
    ("What's a good way to learn linear algebra?",
     "Start with Gilbert Strang's lectures and work through the exercises.",
     "Which topics matter most for machine learning?"),
    ("My Python script is slow when reading a 5 GB CSV.",
     "Read it in chunks with pandas.read_csv(chunksize=...) or use pyarrow.",
     "Can you show me the chunked version that sums one column?"),
    ("Is it safe to eat raw cookie dough?",
     "Raw flour and raw eggs can carry bacteria, so it carries some risk.",
     "What about the heat-treated flour I see in stores?"),
    ("Plan a weekend in Prague.",
     "Day one: Old Town, Charles Bridge, the castle. Day two: Vinohrady and a beer garden.",
     "We arrive Friday night. Anything for late evening?"),
    ("Explain recursion.",
     "A function that calls itself on a smaller input until it reaches a base case.",
     "Show me one in JavaScript that flattens nested arrays."),
    ("What's the capital of Australia?", "Canberra.", "Why not Sydney?"),
    ("Review this: `if x == True: return True else: return False`",
     "It is redundant: `return x == True`, or just `return bool(x)`.",
     "What if x can be None?"),
    ("How long should I boil an egg for a runny yolk?",
     "About six minutes from boiling water, then an ice bath.",
     "And for a firm yolk?"),
    ("What is a monad, in plain terms?",
     "A pattern for chaining computations that carry context, like optional values or I/O.",
     "Give an example with Python's Optional-like code."),
    ("Help me name my startup: it schedules GPU jobs.",
     "Some ideas: Batchwise, Kernel Ops, QueueForge.",
     "Something shorter, one word?"),
    ("Should I use REST or gRPC between internal services?",
     "gRPC for typed, high-throughput internal calls; REST when humans and browsers call it.",
     "What about streaming updates?"),
]

TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    "search_flights": {"type": "function", "function": {
        "name": "search_flights", "description": "Search one-way flights.",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string"}, "destination": {"type": "string"},
            "date": {"type": "string", "description": "YYYY-MM-DD"}},
            "required": ["origin", "destination", "date"]}}},
    "convert_currency": {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount between currencies.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
            "required": ["amount", "from", "to"]}}},
    "get_stock_price": {"type": "function", "function": {
        "name": "get_stock_price", "description": "Latest price of a stock ticker.",
        "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}},
                       "required": ["symbol"]}}},
    "create_event": {"type": "function", "function": {
        "name": "create_event", "description": "Create a calendar event.",
        "parameters": {"type": "object", "properties": {
            "title": {"type": "string"}, "start": {"type": "string"},
            "duration_minutes": {"type": "integer"}}, "required": ["title", "start"]}}},
    "run_sql": {"type": "function", "function": {
        "name": "run_sql", "description": "Run a read-only SQL query on the sales database.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}},
}

TOOL_TASKS = [  # (tools, question, call name, call args, result, answer, follow-up)
    (["get_weather"], "What's the weather like in {city} right now?", "get_weather",
     {"city": "{city}"}, {"temp_c": 17, "conditions": "light rain"},
     "It's 17 °C with light rain in {city}.", "Should I bring an umbrella tomorrow too?"),
    (["search_flights", "get_weather"], "Find me a flight from {city} to Madrid on 2025-05-02.",
     "search_flights", {"origin": "{city}", "destination": "Madrid", "date": "2025-05-02"},
     {"flights": [{"carrier": "IB", "depart": "08:10", "price_eur": 129}]},
     "There's an 08:10 flight for 129 EUR.", "Is there anything in the afternoon?"),
    (["convert_currency"], "How much is 250 US dollars in the currency used in {city}?",
     "convert_currency", {"amount": 250, "from": "USD", "to": "EUR"},
     {"amount": 231.4, "currency": "EUR"}, "250 USD is about 231 EUR.",
     "And what would that be in pounds?"),
    (["get_stock_price"], "What is Nvidia trading at? I'm in {city}.", "get_stock_price",
     {"symbol": "NVDA"}, {"symbol": "NVDA", "price": 118.42}, "NVDA is at 118.42 USD.",
     "Compare that with AMD."),
    (["create_event", "get_weather"], "Book a 45 minute run in {city} tomorrow at 7am.",
     "create_event", {"title": "Run in {city}", "start": "tomorrow 07:00", "duration_minutes": 45},
     {"id": "evt_81", "status": "created"}, "Done: your run is on the calendar for 7:00.",
     "Move it to 7:30 instead."),
    (["run_sql"], "Which product sold the most units last month in the {city} store?",
     "run_sql", {"query": "SELECT product, SUM(units) u FROM sales WHERE store='{city}' "
                          "GROUP BY product ORDER BY u DESC LIMIT 1"},
     {"rows": [["espresso beans 1kg", 412]]}, "Espresso beans (1 kg), 412 units.",
     "How does that compare with the month before?"),
]

CITIES = ["Lisbon", "Oslo", "Nairobi", "Montreal", "Osaka", "Lima", "Krakow", "Seoul",
          "Auckland", "Cairo", "Vienna", "Austin", "Dublin", "Hanoi", "Porto", "Zurich"]

HERMES_PREAMBLE = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user "
    "query. Don't make assumptions about what values to plug into functions. Here are the "
    "available tools: <tools> {tools} </tools> For each function call return a json object "
    "with function name and arguments within <tool_call></tool_call> XML tags.")


def fill(value: Any, city: str) -> Any:
    if isinstance(value, str):
        return value.replace("{city}", city)
    if isinstance(value, dict):
        return {k: fill(v, city) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, city) for v in value]
    return value


def sharegpt(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, (q, a, follow) in enumerate(CHATS * 5):
        turns: list[dict[str, str]] = []
        style = i % 4
        if style in (1, 3):
            turns.append({"from": "system", "value": SYSTEMS[i % len(SYSTEMS)]})
        asked = ['today', 'for a class', 'at work', 'for a friend', 'again'][i // len(CHATS)]
        variant = f" (asked {asked})"
        turns.append({"from": "human", "value": q + variant})
        turns.append({"from": "gpt", "value": a})
        if style >= 2:
            turns.append({"from": "human", "value": follow})
            turns.append({"from": "gpt", "value": rng.choice(["Sure. ", "Good question. ", ""])
                          + "Here is a short answer."})
        out.append({"id": f"sharegpt-{i}", "conversations": turns})
    return out


def openai_tools(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(42):
        names, q, fn, args, result, answer, follow = TOOL_TASKS[i % len(TOOL_TASKS)]
        city = CITIES[(i * 5) % len(CITIES)]
        call_id = f"call_{i:03d}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": fill(q, city)}]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": fn, "arguments": json.dumps(fill(args, city))}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": json.dumps(result)})
        messages.append({"role": "assistant", "content": fill(answer, city)})
        if i % 3 != 0:
            messages.append({"role": "user", "content": follow})
        specs = [TOOLS[n] for n in names]
        if i % 7 == 6:  # tools written into the system prompt instead
            system = ("You are a travel and finance helper.\nAvailable tools:\n"
                      + json.dumps([s["function"] for s in specs], indent=1))
            out.append({"messages": [{"role": "system", "content": system}, *messages]})
        elif i % 2:  # a raw request body
            out.append({"model": "gpt-4o-mini", "temperature": 0.2, "tools": specs,
                        "tool_choice": "auto", "messages": messages})
        else:
            out.append({"messages": messages, "tools": specs})
    return out


def hermes(rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(30):
        names, q, fn, args, result, answer, follow = TOOL_TASKS[(i + 2) % len(TOOL_TASKS)]
        city = CITIES[(i * 3 + 1) % len(CITIES)]
        specs = [TOOLS[n] for n in names]
        tools_text = repr(specs) if i % 2 else json.dumps(specs)  # Hermes v1 uses Python dicts
        call = {"arguments": fill(args, city), "name": fn}
        turns = [
            {"from": "system", "value": HERMES_PREAMBLE.format(tools=tools_text)},
            {"from": "human", "value": fill(q, city)},
            {"from": "gpt",
             "value": f"<tool_call>\n{repr(call) if i % 2 else json.dumps(call)}\n</tool_call>"},
            {"from": "tool", "value": f"<tool_response>\n{json.dumps(result)}\n</tool_response>"},
            {"from": "gpt", "value": fill(answer, city)},
        ]
        if i % 2 == 0:
            turns.append({"from": "human", "value": follow})
        out.append({"id": f"hermes-{i}", "category": "function calling", "conversations": turns})
    return out


def alpaca() -> list[dict[str, Any]]:
    return [{"instruction": ins, "input": inp, "output": ""} for ins, inp in ALPACA]


def plain() -> list[dict[str, Any]]:
    return [{"prompt": p, "source": "hand-written"} for p in PLAIN]


MESSY = [
    b'{"prompt": "What is the boiling point of water at the top of Everest?"}',
    b'{"conversations": [{"from": "human", "value": "This line was cut off mid-recor',
    b'{"conversations": [{"from": "system", "value": "You are helpful."}, '
    b'{"from": "gpt", "value": "Hi!"}]}',
    b'{"conversations": [{"from": "narrator", "value": "It was a dark and stormy night."}]}',
    b'{"prompt": "Explain why the sky is blue to a curious ten-year-old."}',  # a duplicate
    b'{"messages": [{"role": "user", "content": "How do I read a file line by line in Go?"}]}',
]


def write_jsonl(path: Path, records: list[dict[str, Any]], compress: bool = False) -> None:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    if compress:
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


def write_all(out: Path = OUT) -> list[Path]:
    rng = random.Random(20240531)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "sharegpt_chats.jsonl", sharegpt(rng))
    write_jsonl(out / "openai_tool_calls.jsonl", openai_tools(rng))
    (out / "hermes_function_calling.json").write_text(
        json.dumps(hermes(rng), indent=1, ensure_ascii=False) + "\n")
    write_jsonl(out / "alpaca_instructions.jsonl.gz", alpaca(), compress=True)
    write_jsonl(out / "plain_prompts.jsonl", plain())
    (out / "messy_records.jsonl").write_bytes(b"\n".join(MESSY) + b"\n")
    return sorted(out.iterdir())


if __name__ == "__main__":
    for path in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(f"{path.name:32s} {path.stat().st_size:>8,} bytes")
