"""Where a newly assigned partition is read from: the group's committed
offset, read by the member itself, waited for while it is unstable, and
assigned explicitly.

A partition whose last owner died mid-commit has offsets pending in that
owner's transaction: the coordinator answers "unstable" until the
transaction is aborted (by the owner's next incarnation, or after its
transaction timeout and the coordinator's next check), and librdkafka's
committed() times out meanwhile. Left to librdkafka's own fetch at
assignment, a sink under KIP-848 was seen (CI, tests/sink/test_stranding.py)
to start such a partition from its beginning: batches committed long before
were read, uploaded and committed again. Their objects stayed single
(pinned to the same keys), but the counters counted them twice, the run
looked persisted while its last records were not, and a dead-letter record
among them would have been written twice. So the worker and the sink read
the offsets themselves and wait out "unstable", within `wait_s`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TypeGuard

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from tokenmill.log import get_logger

log = get_logger("tokenmill.kafka")

COMMITTED_WAIT_S = 45.0
# One committed() attempt: librdkafka retries "unstable" inside it, so an
# attempt as long as the caller's timeout (10 s) hid a wait for an undecided
# transaction that ended within it: an heir assigned less than 10 s before
# the abort logged nothing of it.
ATTEMPT_S = 2.0

Start = dict[tuple[str, int], int | None]  # (topic, partition) -> committed offset, None: none

# committed() ran out of time: the offsets are held by an undecided
# transaction (_TIMED_OUT), or the request never left the client's queue in
# time (_TIMED_OUT_QUEUE: the coordinator's connection busy or being set up
# again; ci41 saw a worker exit on it in a rebalance on a loaded machine).
# Both are waited out; anything else is the caller's to handle.
_WAITED_OUT = {KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE}


def waited_out(error: object) -> TypeGuard[KafkaError]:
    """Whether a failed read of committed offsets is tried again within the
    wait (pure, tested directly)."""
    return isinstance(error, KafkaError) and error.code() in _WAITED_OUT


def committed_offsets(consumer: Consumer, partitions: Sequence[TopicPartition], *,
                      timeout_s: float, who: str, wait_s: float = COMMITTED_WAIT_S) -> Start:
    """The group's committed offset of each partition (None: nothing
    committed), once no transaction holds it undecided. Raises
    KafkaException when it stays unreadable past `wait_s`, or fails
    otherwise; the caller bounds the whole wait with its watchdog.

    Each attempt gets at most ATTEMPT_S (`timeout_s` when shorter): an
    undecided transaction is reported within seconds of the assignment,
    not after a whole `timeout_s`, and the wait's length is logged when it
    ends (what a member taking over from one that died mid-commit spent)."""
    tps = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
    started = time.monotonic()
    deadline = started + wait_s
    attempt_s = min(timeout_s, ATTEMPT_S)
    waited = False
    while True:
        try:
            found = consumer.committed(tps, timeout=attempt_s)
            break
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not waited_out(error) or time.monotonic() + attempt_s > deadline:
                raise
            if not waited:
                log.warning("committed offsets not readable yet: the partitions' last owner "
                            "may have died inside a transaction; waiting for it to be aborted",
                            who=who, error=error.name(), partitions=_names(tps))
                waited = True
    if waited:
        log.info("committed offsets read after waiting", who=who, partitions=_names(tps),
                 waited_s=round(time.monotonic() - started, 1))
    return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}


def _names(tps: Sequence[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic.rsplit('.', 1)[-1]}-{tp.partition}" for tp in tps)


def place(partitions: Sequence[TopicPartition], start: Start) -> None:
    """Set each partition's offset to where it is read from: its committed
    offset, or its beginning when nothing is committed (never left to
    librdkafka's own fetch of the committed offset). A partition whose
    offset is set already (a worker's parked partition resuming) keeps it."""
    for tp in partitions:
        if tp.offset >= 0:
            continue
        offset = start.get((tp.topic, tp.partition))
        tp.offset = offset if offset is not None else OFFSET_BEGINNING


def assign_unread(consumer: Consumer, partitions: Sequence[TopicPartition], *, who: str) -> None:
    """Partitions handed to a member inside its consumer's close() (moved to
    it before its leave landed): nothing will be read from them, and a
    closing consumer cannot read committed offsets (a stopping sink waited
    COMMITTED_WAIT_S for them, then failed). Assigned as they are, and
    tracked by nothing, they leave with it and commit nothing."""
    consumer.incremental_assign(list(partitions))
    log.info("partitions given while closing: left unread", who=who,
             partitions=sorted(tp.partition for tp in partitions))
