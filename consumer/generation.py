"""One prompt's way through the server: request, classify, retry, record.

Whose fault a failure is decides what happens (consumer/sglang_client.py):
the prompt's (400) is recorded as a failure at once; a transient one (5xx,
timeout, abort) is retried with backoff up to the policy's limit, then
recorded; a server that is down or loading closes the health gate and the
request waits for it, never failing the prompt; a server that refuses our
credentials (401/403) ends the worker. Every failure for good passes the
circuit breaker (consumer/breaker.py) first: when one cause dominates the
recent requests, the prompt is held instead of recorded, and waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from consumer.backoff import RetryPolicy
from consumer.breaker import Breaker
from consumer.health import HealthGate
from consumer.sglang_client import (
    Generated,
    PromptRejected,
    Retryable,
    ServerMisconfigured,
    ServerRefused,
    ServerUnavailable,
    SGLangClient,
    request_body,
)
from schemas import Completion, Failure, PromptRecord, RunSpec
from schemas.completion import CompletionRecord
from tokenmill.log import get_logger

log = get_logger("tokenmill.consumer")


class ServerRefuses(RuntimeError):
    """Every request would fail the same way: the worker must stop."""


@dataclass(frozen=True)
class Outcome:
    record: CompletionRecord  # a completion or a failure: either is committed
    retries: int


class Generator:
    """Parameters: `client`, `gate` (the server's health), `breaker`, `spec`
    (the run), `instance` (stamped on records), `retry`, `on_retry(kind)`,
    `on_latency(seconds)` and `on_breaker(state, cause)` for metrics."""

    def __init__(self, *, client: SGLangClient, gate: HealthGate, spec: RunSpec, instance: str,
                 retry: RetryPolicy, breaker: Breaker | None = None,
                 on_retry: Callable[[str], None] = lambda kind: None,
                 on_latency: Callable[[float], None] = lambda s: None,
                 on_breaker: Callable[[str, str | None], None] = lambda state, cause: None
                 ) -> None:
        self.client = client
        self.gate = gate
        self.breaker = breaker or Breaker()
        self.on_breaker = on_breaker
        self.spec = spec
        self.instance = instance
        self.retry = retry
        self.on_retry = on_retry
        self.on_latency = on_latency

    async def generate(self, prompt: PromptRecord) -> Outcome:
        attempts = 0
        retries = 0
        started = time.monotonic()
        while True:
            await self.gate.wait_open()
            await self._breaker_allows()
            attempt_started = self.breaker.clock()
            attempts += 1
            try:
                result = await self.client.chat(
                    request_body(prompt, self.spec.generation, attempts))
            except (PromptRejected, ServerRefused) as exc:
                if not self._record_failure(exc.kind, str(exc), attempt_started):
                    attempts -= 1
                    continue
                return Outcome(self.failure(prompt, exc.kind, str(exc), exc.status, attempts,
                                            started), retries)
            except Retryable as exc:
                self.on_retry(exc.kind)
                if self.retry.exhausted(attempts):
                    if not self._record_failure(exc.kind, str(exc), attempt_started):
                        attempts = 0  # held: it gets every retry again later
                        continue
                    return Outcome(self.failure(prompt, exc.kind, str(exc), exc.status,
                                                attempts, started), retries)
                retries += 1
                await asyncio.sleep(self.retry.delay(attempts))
                continue
            except ServerUnavailable as exc:
                attempts -= 1  # not the prompt's fault
                self.gate.report_down(str(exc))
                continue
            except ServerMisconfigured as exc:
                raise ServerRefuses(
                    f"the server at {self.client.base_url} refuses requests: {exc}") from None
            was, cause = self.breaker.state, self.breaker.cause
            self.breaker.success(attempt_started)
            if was != "closed" and self.breaker.state == "closed":
                log.info("circuit breaker closed: the server answers again", cause=cause)
                self.on_breaker("closed", None)
            self.on_latency(result.latency_s)
            return Outcome(self.completion(prompt, result, attempts, started), retries)

    def _record_failure(self, cause: str, message: str, started: float) -> bool:
        """Whether this failure may be recorded; False when the breaker holds it."""
        was = self.breaker.state
        allowed = self.breaker.failure(cause, started)
        if self.breaker.state == "open" and was != "open":
            log.error("circuit breaker open: the server fails every request the same way; "
                      "holding prompts (their offsets stay uncommitted) and probing again",
                      cause=cause, example=message[:300],
                      probe_in_s=round(self.breaker.seconds_to_probe(), 1),
                      trips=self.breaker.trips)
            self.on_breaker("open", cause)
        return allowed

    async def _breaker_allows(self) -> None:
        while not self.breaker.may_start():
            await asyncio.sleep(min(1.0, max(0.05, self.breaker.seconds_to_probe())))

    def completion(self, prompt: PromptRecord, result: Generated, attempts: int,
                   started: float) -> Completion:
        return Completion(
            id=prompt.id, run=self.spec.run_id, settings_hash=self.spec.settings_hash,
            prompt=prompt, finish_reason=result.finish_reason, content=result.content,
            reasoning_content=result.reasoning_content, tool_calls=result.tool_calls,
            matched_stop=result.matched_stop, usage=result.usage, spec=result.spec,
            latency_s=round(time.monotonic() - started, 4), attempts=attempts,
            instance=self.instance, model=result.model)

    def failure(self, prompt: PromptRecord, kind: str, error: str, status: int | None,
                attempts: int, started: float) -> Failure:
        return Failure(id=prompt.id, run=self.spec.run_id, settings_hash=self.spec.settings_hash,
                       prompt=prompt, failure=kind, error=error[:2000],  # type: ignore[arg-type]
                       status=status, attempts=attempts, instance=self.instance,
                       latency_s=round(time.monotonic() - started, 4))
