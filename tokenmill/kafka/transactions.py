"""The one transactional commit every service uses (producer, worker, sink).

`start()` creates a service's transactional producer and fences every
earlier incarnation of its transactional id (`init_transactions` aborts
the open transaction a killed predecessor left), under the watchdog, and
returns its `Transactions`.

A transaction is opened only to commit work that is already done, and runs
as numbered steps over one transactional producer:

1. begin;
2. produce the records (a full local queue is waited out, within a deadline);
3. send each consumer group's input offsets with that member's fresh group
   metadata (KIP-447: a member that lost its partitions is fenced here);
4. commit.

Retriable failures of steps 3 and 4 are retried with backoff until the
step's deadline. Any other failure aborts the transaction and raises
`TransactionAborted` (nothing of it is visible; the caller keeps or replays
its work). An abort that times out is resumed, as librdkafka documents. A
fenced or fatal producer, or an abort that fails for good, raises
`KafkaFatal`: the process cannot go on and must exit with one line, so that
its supervisor restarts it from committed state.

Every step is reported to a `TransactionHooks` object. The default one
reports it as a crash point (`transaction.<step>`, tokenmill/crashpoints.py)
where a test entry point can kill the process; unit tests pass their own
to fail a step. No fault switch lives in the services themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from tokenmill import crashpoints
from tokenmill.backoff import Backoff
from tokenmill.kafka import clients
from tokenmill.log import get_logger
from tokenmill.settings import Settings
from tokenmill.watchdog import Watchdog

log = get_logger("tokenmill.kafka.transactions")

# An abort that timed out is resumed this many times in all (each call
# waits up to the step timeout) before the process gives up.
ABORT_ATTEMPTS = 3

# How long `init_transactions` may take: it waits for the coordinator to
# abort a dead predecessor's open transaction.
INIT_TIMEOUT_S = 60.0

# Record headers as the services make them. confluent-kafka's stub asks for a
# list[tuple[str, str | bytes | None]], and a list is invariant: the calls
# that pass these on say so (no copy on the producer's hot path).
Headers = list[tuple[str, bytes]]

Step = Literal["begin", "produced", "offsets_sent", "committing", "committed", "aborted"]
Verdict = Literal["fatal", "abort", "retry"]

# Codes that mean another process took over this transactional id, or that
# this producer can never commit again.
_FENCED = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.INVALID_PRODUCER_ID_MAPPING,
}


class TransactionAborted(Exception):
    """The transaction was aborted: nothing of it is visible. The caller keeps
    its results for the next commit, or replays them."""


class KafkaFatal(RuntimeError):
    """The transactional producer is fenced or broken: exit with this message
    and let the supervisor restart the service from committed state."""


def kafka_error(exc: BaseException) -> KafkaError | None:
    arg = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return arg if isinstance(arg, KafkaError) else None


def classify(error: KafkaError) -> Verdict:
    """What a failed transaction step calls for (pure, tested directly).

    A step that timed out is fatal: the broker did not answer within the
    transaction timeout, and librdkafka answering such a request late (after
    the abort) was seen to abort the process (`rd_kafka_enq_once_del_source_
    return: Assertion eonce->refcnt > 0`, librdkafka 2.16). A fresh process
    recovers from committed state instead. A step the broker's ACLs refuse
    is fatal too: an aborted and retried transaction would be refused again,
    forever."""
    if (error.fatal() or error.code() in _FENCED or error.code() == KafkaError._TIMED_OUT
            or clients.refused_by_acl(error)):
        return "fatal"
    if error.txn_requires_abort():
        return "abort"
    if error.retriable():
        return "retry"
    return "abort"


def fenced_message(error: KafkaError, transactional_id: str) -> str:
    """One line that says what happened and what to look at."""
    if clients.refused_by_acl(error):
        return (f"Kafka refused transactional producer {transactional_id}: {error.str()} "
                f"({error.name()}); its principal lacks an ACL (`tokenmill deploy acls --run "
                "RUN` prints each role's)")
    if error.code() == KafkaError._TIMED_OUT:
        return (f"Kafka did not answer a transaction step of {transactional_id} in time "
                f"(broker down or restarting?); restarting from committed state "
                f"({error.str()})")
    if error.code() in _FENCED or "fenced" in error.str().lower() or "epoch" in error.str().lower():
        return (f"another process took over transactional id {transactional_id} (same run "
                f"and --instance?), so this one stopped; nothing it had not committed is "
                f"visible ({error.str()})")
    return f"Kafka producer {transactional_id} failed for good: {error.str()}"


class TransactionHooks:
    """Observes each step: reports it as the crash point `transaction.<step>`;
    unit tests subclass it to fail a step."""

    def step(self, name: Step, transaction: int, producer: Producer) -> None:
        """Called after each step; `transaction` counts from 1 per producer."""
        crashpoints.reached(f"transaction.{name}", transaction, lambda: producer.flush(30))


NO_HOOKS = TransactionHooks()


@dataclass(frozen=True)
class GroupOffsets:
    """Input offsets of one consumer group member, sent with its metadata."""

    offsets: Sequence[TopicPartition]
    group_metadata: Callable[[], Any]  # fresh at send time (KIP-447)


# Between retries of a transaction step, within the step's deadline.
STEP_BACKOFF = Backoff(first_s=0.1, cap_s=2.0)


# librdkafka's send_offsets_to_transaction can block past the timeout given
# to it: its coordinator request's own timeout is never checked (librdkafka
# #5456), and a coordinator cached across a broker restart is not looked up
# again (#5511). Seen here in the broker-fault test: every worker and the
# sink stuck in it after each restart of the broker, until the watchdog. Past
# its timeout by this margin, it is that hang.
SEND_OFFSETS_MARGIN_S = 5.0
# The offsets are one small request to the group's coordinator: given at
# most this long, the hang ends the process (and its uncommitted results)
# 15 s after it began, not 25-35 s.
SEND_OFFSETS_TIMEOUT_S = 10.0


def step_timeout(what: str, timeout_s: float) -> float:
    """The timeout a transaction step is given (pure)."""
    if what == "send_offsets_to_transaction":
        return min(timeout_s, SEND_OFFSETS_TIMEOUT_S)
    return timeout_s


def guard_limit(what: str, timeout_s: float) -> float:
    """How long the watchdog lets a transaction step block (pure). A step
    given `timeout_s` may take longer when librdkafka retries inside it;
    send_offsets_to_transaction past its own timeout is the known hang."""
    if what == "send_offsets_to_transaction":
        return step_timeout(what, timeout_s) + SEND_OFFSETS_MARGIN_S
    return timeout_s * 2 + 10


class Transaction:
    """An open transaction; produce into it, send offsets, then leave the
    `with` block to commit."""

    __slots__ = ("producer", "deadline_s", "_produce")

    def __init__(self, producer: Producer, deadline_s: float) -> None:
        self.producer = producer
        self.deadline_s = deadline_s
        self._produce = producer.produce

    def produce(self, topic: str, value: bytes, key: bytes | None = None,
                partition: int | None = None,
                headers: Headers | None = None) -> None:
        """Produce, waiting out a full local queue within the deadline. The
        publisher's hot path: one C call when the queue has room."""
        try:
            self._produce(topic, value, key, -1 if partition is None else partition,
                          headers=headers)  # type: ignore[arg-type]  # see Headers
        except BufferError:
            self._produce_when_room(topic, value, key, partition, headers)

    def _produce_when_room(self, topic: str, value: bytes, key: bytes | None,
                           partition: int | None,
                           headers: Headers | None) -> None:
        deadline = time.monotonic() + self.deadline_s
        while True:
            self.producer.poll(0.05)
            try:
                self._produce(topic, value, key, -1 if partition is None else partition,
                              headers=headers)  # type: ignore[arg-type]  # see Headers
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the producer queue stayed full for "
                                       f"{self.deadline_s:.0f}s") from None


class Transactions:
    """The transactions of one transactional producer (already initialized).

    Parameters: `producer`, `transactional_id` (for messages), `timeout_s`
    (each step's deadline, retries included), `backoff`, `hooks`,
    `watchdog` (bounds every blocking call; none in unit tests)."""

    def __init__(self, producer: Producer, *, transactional_id: str, timeout_s: float = 30.0,
                 backoff: Backoff = STEP_BACKOFF, hooks: TransactionHooks | None = None,
                 watchdog: Watchdog | None = None) -> None:
        self.producer = producer
        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self.backoff = backoff
        self.hooks = hooks or NO_HOOKS
        self.watchdog = watchdog
        self.count = 0

    @contextmanager
    def transaction(self, offsets: Callable[[], Sequence[GroupOffsets]] = lambda: ()
                    ) -> Iterator[Transaction]:
        """Begin; the body produces; then offsets (computed after the body)
        and commit. Raises TransactionAborted or KafkaFatal."""
        self.count += 1
        number = self.count
        try:
            self._call("begin_transaction", self.producer.begin_transaction)
        except KafkaException as exc:  # nothing open to abort: the producer is unusable
            raise KafkaFatal(f"cannot begin a transaction of {self.transactional_id}: "
                             f"{exc}") from None
        transaction = Transaction(self.producer, self.timeout_s)
        try:
            self.hooks.step("begin", number, self.producer)
            yield transaction
            self.hooks.step("produced", number, self.producer)
            for group in offsets():
                if group.offsets:
                    self._send_offsets(group)
            self.hooks.step("offsets_sent", number, self.producer)
            self.hooks.step("committing", number, self.producer)
            self._retrying("commit_transaction", lambda: self.producer.commit_transaction(
                self.timeout_s))
        except KafkaFatal:
            raise
        except BaseException as exc:  # noqa: BLE001 - every early exit aborts
            error = kafka_error(exc)
            if error is not None and classify(error) == "fatal":
                raise KafkaFatal(fenced_message(error, self.transactional_id)) from None
            self._abort(exc)
            self.hooks.step("aborted", number, self.producer)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise TransactionAborted(str(error or exc)) from None
        self.hooks.step("committed", number, self.producer)

    def _send_offsets(self, group: GroupOffsets) -> None:
        timeout_s = step_timeout("send_offsets_to_transaction", self.timeout_s)
        self._retrying("send_offsets_to_transaction", lambda: (
            self.producer.send_offsets_to_transaction(
                list(group.offsets), group.group_metadata(), timeout_s)))

    def _guarded(self, what: str, call: Callable[[], Any]) -> Any:
        """The call, bounded by the watchdog (if any); errors pass unchanged."""
        if self.watchdog is None:
            return call()
        with self.watchdog.guard(what, guard_limit(what, self.timeout_s)):
            return call()

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        try:
            return self._guarded(what, call)
        except KafkaException as exc:
            error = kafka_error(exc)
            if error is not None and classify(error) == "fatal":
                raise KafkaFatal(fenced_message(error, self.transactional_id)) from None
            raise

    def _retrying(self, what: str, call: Callable[[], Any]) -> None:
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            attempt += 1
            try:
                self._call(what, call)
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                if (error is None or classify(error) != "retry"
                        or time.monotonic() + self.backoff.delay(attempt) > deadline):
                    raise
                log.info("retrying a transaction step", step=what, attempt=attempt,
                         error=error.str())
                time.sleep(self.backoff.delay(attempt))

    def _abort(self, cause: BaseException) -> None:
        """Abort; an abort that timed out is resumed (librdkafka keeps aborting
        in the background and documents calling it again), up to
        ABORT_ATTEMPTS calls. Under a starved broker one abort was seen to take
        longer than the transaction timeout, and exiting then took a healthy
        worker down with it."""
        log.warning("transaction aborted", transactional_id=self.transactional_id,
                    cause=str(cause) or type(cause).__name__)
        for attempt in range(1, ABORT_ATTEMPTS + 1):
            try:
                self._guarded("abort_transaction", lambda: self.producer.abort_transaction(
                    self.timeout_s))
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                if (error is not None and error.code() == KafkaError._TIMED_OUT
                        and attempt < ABORT_ATTEMPTS):
                    log.warning("the abort is taking long; resuming it",
                                transactional_id=self.transactional_id, attempt=attempt,
                                waited_s=round(attempt * self.timeout_s))
                    continue
                if (error is not None and error.code() != KafkaError._TIMED_OUT
                        and classify(error) == "fatal"):
                    raise KafkaFatal(fenced_message(error, self.transactional_id)) from None
                raise KafkaFatal(
                    f"could not abort a transaction of {self.transactional_id} "
                    f"({error.str() if error else exc}); restarting from committed state "
                    "is the only safe way on") from None


def start(settings: Settings, transactional_id: str, *,
          config: Mapping[str, Any] | None = None, timeout_s: float = 30.0,
          transaction_timeout_s: float | None = None,
          hooks: TransactionHooks | None = None,
          watchdog: Watchdog | None = None) -> Transactions:
    """The transactional producer of `transactional_id`, initialized: every
    earlier incarnation is fenced and its open transaction aborted, so the
    committed state read next is final. Raises KafkaFatal (one line) when
    the broker refuses or does not answer within INIT_TIMEOUT_S.

    Parameters: `config` (librdkafka settings over the shared ones),
    `timeout_s` (each transaction step's deadline), `transaction_timeout_s`
    (the broker's: how long a transaction left open by a dead process holds
    its partitions back; default clients.transactional_producer's), `hooks`,
    `watchdog` (bounds `init_transactions` and every later step)."""
    timeout = ({} if transaction_timeout_s is None
               else {"transaction.timeout.ms": round(transaction_timeout_s * 1000)})
    producer = clients.transactional_producer(settings, transactional_id,
                                              {**timeout, **(config or {})})
    guard: AbstractContextManager[None] = (
        watchdog.guard("init_transactions", INIT_TIMEOUT_S * 2 + 10)
        if watchdog is not None else nullcontext())
    try:
        with guard:
            producer.init_transactions(INIT_TIMEOUT_S)
    except KafkaException as exc:
        raise KafkaFatal(f"could not start transactional producer {transactional_id}: "
                         f"{exc.args[0] if exc.args else exc}") from None
    return Transactions(producer, transactional_id=transactional_id, timeout_s=timeout_s,
                        hooks=hooks, watchdog=watchdog)

