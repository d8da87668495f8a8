"""What every subcommand shares: the settings options, logging set-up, and
turning known failures into one clear line instead of a traceback."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from tokenmill import log
from tokenmill.flag_types import seconds
from tokenmill.settings import Settings, SettingsError, pop_settings, settings_options

F = TypeVar("F", bound=Callable[..., Any])

# Failures of the environment a user can fix (a broker or bucket that is not
# there, a conflicting run); they print as "Error: <message>" with exit code 1.
# Settings errors are usage errors (exit code 2).
_known: list[type[BaseException]] = [SettingsError]


def register_known_error(*types: type[BaseException]) -> None:
    """Commands above the plumbing (the dev stack, say) register their own."""
    _known.extend(t for t in types if t not in _known)


def _known_errors() -> tuple[type[BaseException], ...]:
    # Imported lazily so the CLI does not pay for every service at start-up.
    from tokenmill.kafka.clients import BrokerRefused, BrokerUnreachable
    from tokenmill.registry import RunConflict, UnknownRun
    from tokenmill.startup import DependencyDown

    return (BrokerRefused, BrokerUnreachable, DependencyDown, RunConflict, UnknownRun,
            FileNotFoundError, *_known)


def finish_now(code: int = 0) -> NoReturn:
    """A service that finished: out at once, after flushing its output. Its
    work is committed; finalizers of Kafka clients could only block."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_now(message: str, code: int = 1) -> NoReturn:
    """A service that cannot go on: one line, then out at once. No
    finalizers run: destroying a Kafka client whose broker is gone can block,
    and the supervisor restarts the service from committed state anyway."""
    sys.stdout.flush()
    print(f"Error: {message}", file=sys.stderr, flush=True)
    os._exit(code)


def run_service(run: Callable[[], int], *,
                fatal: tuple[type[BaseException], ...] = ()) -> int:
    """A long-running service (worker, sink) to its exit code. When it cannot
    go on, one `Error:` line and exit code 1, at once (`exit_now`): a fenced
    or broken Kafka client (KafkaFatal), one of the service's own `fatal`
    errors, or anything else Kafka raised (`kafka: ...`, not a traceback).
    The supervisor restarts it from committed state."""
    # Imported here: the CLI does not pay for the Kafka client at start-up.
    from confluent_kafka import KafkaException

    from tokenmill.kafka.transactions import KafkaFatal

    ends: tuple[type[BaseException], ...] = (KafkaFatal, *fatal)
    try:
        return run()
    except ends as exc:
        exit_now(str(exc))
    except KafkaException as exc:
        exit_now(f"kafka: {exc.args[0] if exc.args else exc}")
    except TimeoutError as exc:
        # a bounded wait (a committed read, a full queue) ran out: beyond
        # this process's repair, not a traceback
        exit_now(f"gave up waiting: {exc}")


_AUTHORIZATION_ERRORS = {"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
                         "CLUSTER_AUTHORIZATION_FAILED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}


def refused_access(settings: Settings, exc: BaseException) -> str | None:
    """One line for a Kafka call the broker's ACLs refused (None: another
    failure). The principal lacks an ACL: waiting or retrying cannot help."""
    from confluent_kafka import KafkaError, KafkaException

    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(error, KafkaError) or error.name() not in _AUTHORIZATION_ERRORS:
        return None
    who = f"{settings.sasl_username!r}" if settings.sasl_username else "this client"
    return (f"Kafka at {settings.bootstrap_servers} refused {who}: {error.str()} "
            f"({error.name()}); each role needs the ACLs `tokenmill deploy acls --run RUN` "
            "prints (to a principal without DESCRIBE, a topic looks missing)")


def kafka_failure(settings: Settings, exc: BaseException) -> str | None:
    """One line for a Kafka call that failed for a reason other than ACLs (a
    broker down or restarting past the call's timeout): the supervisor's
    restart retries it (None: not a Kafka failure)."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException):
        return None
    error = exc.args[0] if exc.args else None
    what = f"{error.str()} ({error.name()})" if isinstance(error, KafkaError) else str(exc)
    return f"Kafka at {settings.bootstrap_servers} failed: {what}; is a broker down or restarting?"


def service_command(func: F) -> F:
    """Adds the shared options; the wrapped function receives `settings`."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        settings = pop_settings(kwargs)
        log.configure(settings.log_level, settings.log_format)
        try:
            return func(*args, settings=settings, **kwargs)
        except click.ClickException:
            raise
        except _known_errors() as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            refused = refused_access(settings, exc) or kafka_failure(settings, exc)
            if refused is None:
                raise
            raise click.ClickException(refused) from None

    return settings_options(wrapper)  # type: ignore[return-value]


def transaction_timeout_option(member: str, default_s: float) -> Callable[[F], F]:
    """`--transaction-timeout` of a service that commits in transactions
    (`member`: "worker", "sink"): the broker's timeout of its transactions
    (`default_s`: clients.TRANSACTION_TIMEOUT_S, passed in so that this
    module, which every command imports, does not import the Kafka client)."""
    return click.option(
        "--transaction-timeout", "transaction_timeout_s", default=default_s, show_default=True,
        type=seconds(1, 900, min_open=False),
        help=f"Seconds the broker lets one of this {member}'s transactions stay open: a "
             f"{member} that dies inside one holds its partitions' committed offsets "
             f"undecided this long, and the {member} taking them over waits (at most the "
             "broker's transaction.max.timeout.ms).")


__all__ = ["Settings", "register_known_error", "run_service", "service_command",
           "transaction_timeout_option"]
