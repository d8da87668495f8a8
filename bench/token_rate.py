"""A simulator's own token counter, sampled while a run goes on: the same
view of throughput whichever client drives it, and the window in which the
server generated (so a side's start-up and tail can be told apart from its
steady state)."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.consume_sides import Side
from bench.figures import median_paired_ratio


class TokenRate:
    """Samples the simulator's sglang:generation_tokens_total while a run goes
    on: the server's own view of throughput, the same for every client."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith("sglang:generation_tokens_total"):
                        self.samples.append((time.monotonic(), float(line.rsplit(" ", 1)[1])))
            time.sleep(0.25)

    def __enter__(self) -> TokenRate:  # noqa: PYI034
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def steady_rate(self) -> float:
        """Tokens/s over the middle 80% of the active window (first to last
        token): diagnosis only, start-up and tail left out."""
        active = [s for s in self.samples if s[1] > self.samples[0][1]]
        last_value = self.samples[-1][1]
        active = [s for s in active if s[1] < last_value] or active
        t0, t1 = active[0][0], active[-1][0]
        lo, hi = t0 + (t1 - t0) * 0.1, t1 - (t1 - t0) * 0.1
        window = [s for s in active if lo <= s[0] <= hi]
        if len(window) < 2:
            return float("nan")
        return round((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]))

    def first_token_at(self) -> float:
        """When (time.monotonic) the counter first rose: the first token."""
        first = self.samples[0][1]
        rising = [t for t, v in self.samples if v > first]
        return rising[0] if rising else float("nan")

    def last_token_at(self) -> float:
        """When (time.monotonic) the counter reached its final value."""
        last = self.samples[-1][1]
        return next((t for t, v in self.samples if v >= last), float("nan"))

    def active_s(self) -> float:
        """Seconds from the first generated token the server counted to the
        last: the run's generation, without the client's start-up and tail."""
        return round(self.last_token_at() - self.first_token_at(), 2)


@dataclass(frozen=True)
class Measured:
    """One side of one run, with its server(s)' own view of it."""

    side: Side
    steady_tok_s: float  # the servers' summed rate over each one's middle 80%
    active_s: float  # first generated token on any server to the last

    @property
    def tok_s(self) -> float:
        return self.side.completion_tokens / self.side.wall_s

    @property
    def fixed_s(self) -> float:
        """Wall clock no server generated for this side: start-up before the
        first token and the tail after the last."""
        return round(self.side.wall_s - self.active_s, 2)


def measured(urls: Sequence[str], run_side: Callable[[], Side]) -> Measured:
    """`run_side()` with the token counters of the servers at `urls` sampled
    around it."""
    meters = [TokenRate(url) for url in urls]
    with contextlib.ExitStack() as stack:
        for meter in meters:
            stack.enter_context(meter)
        side = run_side()
    active = (max(m.last_token_at() for m in meters)
              - min(m.first_token_at() for m in meters))
    return Measured(side, sum(m.steady_rate() for m in meters), round(active, 2))


def split_details(ours: Sequence[Measured], base: Sequence[Measured], *, steady_method: str,
                  fixed_method: str) -> dict[str, object]:
    """The figure's details that tell the steady state from the fixed cost
    (start-up and tail), for pairs where ours[i] ran beside base[i]."""
    return {
        "steady_state_ratio": median_paired_ratio([o.steady_tok_s for o in ours],
                                                  [b.steady_tok_s for b in base]),
        "steady_state_tok_s_tokenmill": [o.steady_tok_s for o in ours],
        "steady_state_tok_s_baseline": [b.steady_tok_s for b in base],
        "fixed_cost_s_tokenmill": [o.fixed_s for o in ours],
        "fixed_cost_s_baseline": [b.fixed_s for b in base],
        "fixed_cost_share_tokenmill": [round(o.fixed_s / o.side.wall_s, 4) for o in ours],
        "steady_state_method": steady_method,
        "fixed_cost_method": fixed_method,
    }
