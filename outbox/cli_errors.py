"""What the ``outbox`` command says when a command fails: one line on stderr and an exit status,
instead of a traceback (``--debug`` or ``OUTBOX_DEBUG=1`` prints the traceback as well).

Exit statuses: 0 success; 1 a runtime failure (PostgreSQL or the broker unreachable, the schema
not migrated, a refused migration, an action not found); 2 a usage or configuration error (a bad
option or number, as argparse reports them, a missing or malformed setting or URL); 130 when
interrupted (Ctrl-C).
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.errors import ConfigurationError, InvalidActionRequest, OutboxError

#: Exit statuses of the ``outbox`` command.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Environment variable that makes a failing command print its traceback (any of 1/true/yes).
DEBUG_ENV = "OUTBOX_DEBUG"


@dataclass(frozen=True, slots=True)
class Failure:
    status: int
    message: str


def _one_line(error: BaseException) -> str:
    """The error's text on one line (libpq's messages run over several)."""
    return " ".join(part.strip() for part in str(error).splitlines() if part.strip())


def _broker_error(error: BaseException) -> str | None:
    """Which broker failed, for the errors Redis, pika and Dramatiq raise; else None."""
    import dramatiq.errors

    try:
        import redis.exceptions

        if isinstance(error, redis.exceptions.RedisError):
            return "Redis (broker)"
    except ImportError:  # pragma: no cover - redis is a dependency
        pass
    try:
        import pika.exceptions

        if isinstance(error, pika.exceptions.AMQPError):
            return "RabbitMQ (broker)"
    except ImportError:  # pragma: no cover - pika is a dependency
        pass
    # Named BrokerConnectionError since Dramatiq 2, ConnectionError before.
    connection_error = getattr(dramatiq.errors, "BrokerConnectionError", None)
    if isinstance(error, connection_error or dramatiq.errors.ConnectionError):
        return "broker"
    return None


def explain(error: Exception) -> Failure:
    """The exit status and the one line for what a command raised."""
    # Imported on a failure only: a command that succeeds without PostgreSQL (``outbox
    # health``) does not load psycopg.
    import psycopg
    from psycopg import errors as pg_errors

    # PostgreSQL errors that mean the outbox's tables are not in that schema.
    not_migrated = (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName)
    text = _one_line(error) or type(error).__name__
    if isinstance(error, psycopg.Error) and error.diag.message_primary:
        text = error.diag.message_primary  # without the statement excerpt that follows it
    if isinstance(error, ConfigurationError | InvalidActionRequest):
        return Failure(EXIT_USAGE, text)
    if isinstance(error, OutboxError):
        return Failure(EXIT_FAILURE, text)
    if isinstance(error, not_migrated):
        return Failure(
            EXIT_FAILURE,
            f"the schema is not migrated ({text}): run `outbox migrate` for this schema "
            "(--schema, $OUTBOX_SCHEMA)",
        )
    if isinstance(error, psycopg.OperationalError):
        return Failure(EXIT_FAILURE, f"PostgreSQL unreachable or refused: {text}")
    if isinstance(error, psycopg.Error):
        return Failure(EXIT_FAILURE, f"PostgreSQL: {text}")
    broker = _broker_error(error)
    if broker is not None:
        return Failure(EXIT_FAILURE, f"{broker} unreachable or refused: {text}")
    if isinstance(error, OSError):
        return Failure(EXIT_FAILURE, text)
    return Failure(
        EXIT_FAILURE,
        f"unexpected {type(error).__name__}: {text} (--debug or {DEBUG_ENV}=1 shows the traceback)",
    )
