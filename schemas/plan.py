"""A plan: what a dataset will cost before the GPUs are rented.

`tokenmill plan` writes it (`--json`, `--output`); `tokenmill produce --plan`
reads it and stores its prediction as the run's estimate. Version 1: later
versions only add fields, and readers ignore fields they do not know, so a
plan file stays readable.

Shape (every number is for the whole dataset unless it says per GPU):

* `dataset`: prompts after produce's normalization (same multi-turn policy and
  tool handling), and the strata (source file x category) the sample was
  drawn from, with how many prompts each holds and how many were sampled;
* `prompt_tokens`: mean and total, counted by the server or estimated;
* `calibration` (with a server): the concurrency sweep, the fitted throughput
  curve and the recommended concurrency (the knee);
* `lengths` (with a server): the sample's answers, generated with the largest
  candidate `max_tokens`; each is `[stratum, tokens, outcome]`;
* `assumptions`: GPUs, price and throughput the predictions use;
* `predictions`: one row per candidate `max_tokens` (one row without a server).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.run import InputFile

PLAN_VERSION = 1

# How a sampled answer ended when generated with `Lengths.max_tokens`:
# "stop"       - finished by itself with `tokens` tokens;
# "length"     - cut at max_tokens (it needs more than `tokens`);
# "unfinished" - still running when calibration ended; it needs more than
#                `tokens`, the output it had most likely reached by then.
Outcome = Literal["stop", "length", "unfinished"]


class Stratum(msgspec.Struct, frozen=True):
    source: str  # input file, as produce names it
    category: str  # plain | system-prompt | multi-turn | tools
    prompts: int  # in the dataset
    sampled: int  # in the sample


class Dataset(msgspec.Struct, frozen=True):
    prompts: int
    rejected: int
    duplicates: int
    multi_turn: str
    tools: str
    inputs: tuple[InputFile, ...]
    strata: tuple[Stratum, ...]


class PromptTokens(msgspec.Struct, frozen=True):
    mean: float  # per prompt
    total: float  # for the dataset
    # "server": the server's usage counts for the sample; "estimate":
    # ceil(chars / 4) + 4 per message (+ tool definitions), no tokenizer.
    source: Literal["server", "estimate"]


class Level(msgspec.Struct, frozen=True):
    concurrency: int  # requests held in flight
    seconds: float  # how long the level was held
    request_seconds: float  # in-flight request time attributed to it (the evidence)
    tokens_per_s: float  # output tokens/s of the server at this concurrency


class Curve(msgspec.Struct, frozen=True):
    """tokens_per_s(c) = max_tokens_per_s * x / (1 + x**sharpness)**(1/sharpness),
    x = c / knee: linear growth for c << knee, the plateau for c >> knee."""

    max_tokens_per_s: float
    knee: float
    sharpness: float


class Calibration(msgspec.Struct, frozen=True):
    server: str  # base URL (without credentials)
    model: str
    server_max_running_requests: int | None  # from /get_server_info, when SGLang says
    time_budget_s: float
    seconds: float  # spent
    requests: int  # finished requests
    failures: int  # requests that failed (errors after retries, rejected prompts)
    interrupted: bool  # stopped by Ctrl-C: everything below is what was measured so far
    levels: tuple[Level, ...]
    curve: Curve | None
    knee_concurrency: int  # the smallest concurrency reaching 95% of the plateau
    recommended_concurrency: int  # the knee + 25% (slots refill late; capped at the top level)
    tokens_per_s: float  # one server's output tokens/s at the recommended concurrency
    saturated: bool  # False: throughput still grew at the highest level measured


class Answer(msgspec.Struct, frozen=True, array_like=True):
    stratum: int  # index into dataset.strata
    tokens: int
    outcome: Outcome


class Lengths(msgspec.Struct, frozen=True):
    max_tokens: int  # the budget the sample's answers were generated with
    answers: tuple[Answer, ...]


class Assumptions(msgspec.Struct, frozen=True):
    gpus: int
    gpu_hour_cost: float
    # "calibration": measured throughput; "flags": --estimate-rps/--estimate-output-tokens
    source: Literal["calibration", "flags"]
    concurrency: int | None = None  # per GPU (calibration)
    tokens_per_s_per_gpu: float | None = None  # at that concurrency (calibration)
    requests_per_s: float | None = None  # all GPUs (flags)
    output_tokens: float | None = None  # per prompt (flags)


class Prediction(msgspec.Struct, frozen=True):
    max_tokens: int | None  # None: from the flags, no candidate
    truncated_share: float | None  # share of answers cut at max_tokens (None: unknown)
    output_tokens_per_prompt: float
    output_tokens: float
    requests_per_s: float  # all GPUs together
    hours: float  # wall clock, first request to last answer
    gpu_hours: float
    cost: float


class Plan(msgspec.Struct, frozen=True):
    created_at: float  # unix time
    dataset: Dataset
    prompt_tokens: PromptTokens
    assumptions: Assumptions
    predictions: tuple[Prediction, ...]
    calibration: Calibration | None = None
    lengths: Lengths | None = None
    notes: tuple[str, ...] = ()
    v: int = PLAN_VERSION

    def prediction_for(self, max_tokens: int | None) -> Prediction | None:
        for prediction in self.predictions:
            if prediction.max_tokens == max_tokens:
                return prediction
        return None


plan_decoder = msgspec.json.Decoder(Plan)
