"""Exceptions the outbox raises to its callers."""

from __future__ import annotations


class OutboxError(Exception):
    """Base class of every error the outbox raises on purpose."""


class InvalidActionRequest(OutboxError, ValueError):
    """An enqueue was refused because of one field; nothing was written.

    ``field`` names the request's field, ``message`` says what is wrong with it, and ``index``
    is the position of the refused request in an ``enqueue_many`` batch (None for ``enqueue``).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.index: int | None = None

    def for_request(self, index: int) -> InvalidActionRequest:
        """This error, naming the request's position in its batch as well (returns itself)."""
        self.index = index
        self.args = (f"request {index}: {self.field}: {self.message}",)
        return self


class UnknownKindError(InvalidActionRequest):
    """The kind is not declared in ``agent_action_kind`` (run ``outbox migrate``)."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            "kind", f"unknown action kind {kind!r}; declare it and run `outbox migrate`"
        )
        self.kind = kind


class KindConflictError(OutboxError):
    """``outbox migrate`` refused to change a kind's flags while it has live actions."""


class AdapterAlreadyRegistered(OutboxError):
    """A kind has exactly one adapter; a second registration is a programming error."""


class ActionNotFound(OutboxError):
    """No action with that id (it may have been erased or pruned)."""


class IllegalTransition(OutboxError):
    """``admit``/``refuse`` on an action that is no longer PROPOSED."""


class DrainDidNotSettle(OutboxError):
    """``outbox.testing.drain`` still found due actions after its bound."""


class ConfigurationError(OutboxError):
    """A setting is missing or malformed."""


class TransactionOpenError(OutboxError):
    """An adapter was about to run while this executor held a database transaction open."""


class UnusableConnection(OutboxError, TypeError):
    """A call was given a connection it cannot run on: an object of a type it does not know, a
    closed connection, an async one for a sync call (or the reverse), or one outside the
    transaction the call must join (Django's connection outside ``transaction.atomic()``, an
    asyncpg connection outside ``conn.transaction()``). Nothing was written."""
