"""When a worker stops fetching (pure; the worker applies the answer to
every slot and to every newly assigned partition).

Fetching pauses while the server is down, while stopping, and when the
local buffer has stayed full for a while (a slow GPU, or every request
waiting): paused partitions let the worker keep polling, and so keep its
group membership, without fetching more. A worker whose buffer is full and
not paused does not poll at all, so it answers its group's rebalance
callbacks only once a request finishes or the pause comes: the pause's
delay bounds how long a newcomer waits for the partitions this worker gives
it (10 s before: the stranding tests showed each such move late by 10 s).
A short burst of a full buffer does not pause (resuming costs a fetch
round trip); once paused, fetching resumes when the buffer is down to half
the limit, so the requests never wait for the fetch.
"""

from __future__ import annotations

from dataclasses import dataclass

PAUSE_AFTER_FULL_S = 2.0


@dataclass
class PausePolicy:
    after_full_s: float = PAUSE_AFTER_FULL_S
    full_since: float | None = None

    def want(self, *, buffered: int, limit: int, paused: bool, stopping: bool,
             server_up: bool, now: float) -> bool:
        if stopping or not server_up:
            return True
        if buffered < limit:
            self.full_since = None
        elif self.full_since is None:
            self.full_since = now
        if paused:
            return buffered > limit // 2
        return self.full_since is not None and now - self.full_since >= self.after_full_s
