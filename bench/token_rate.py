"""A simulator's own token counter, sampled while a run goes on: the same
view of throughput whichever client drives it, and the window in which the
server generated (so a side's start-up and tail can be told apart from its
steady state)."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Protocol

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


class Split(Protocol):
    """One side of one pair, split by its server(s)' token counters."""

    @property
    def side(self) -> Side: ...

    @property
    def steady_tok_s(self) -> float: ...

    @property
    def fixed_s(self) -> float: ...


def split_details(ours: Sequence[Split], base: Sequence[Split], *, steady_method: str,
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
