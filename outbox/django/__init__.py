"""The outbox in a Django project: add ``"outbox.django"`` to ``INSTALLED_APPS``, describe the
outbox in ``settings.OUTBOX``, and enqueue on Django's connection inside
``transaction.atomic()``::

    OUTBOX = {
        "APP": "myproject.effects:outbox",  # the project's Outbox (kinds and adapters)
        "DATABASE": "default",  # the DATABASES alias that holds the outbox (default)
        "SCHEMA": "outbox",  # any other Settings field, by name (durations in seconds)
    }

    from django.db import transaction
    from outbox.django import enqueue

    with transaction.atomic():
        order.save()
        enqueue(ActionRequest(...))  # commits or rolls back with the order

``manage.py outbox_migrate`` creates the outbox's tables; ``manage.py outbox VERB ...`` runs any
``outbox`` command (claimer, worker, status, prune, ...) on the project's database and settings.
See docs/integrations.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from outbox.action import Action
from outbox.django.conf import get_outbox, outbox_settings
from outbox.request import ActionRequest

__all__ = [
    "admit",
    "connection",
    "enqueue",
    "enqueue_many",
    "get_outbox",
    "outbox_settings",
    "refuse",
]


def connection(using: str | None = None) -> Any:
    """Django's connection for ``using`` (default: ``OUTBOX["DATABASE"]``, else "default")."""
    from django.db import connections

    from outbox.django.conf import database_alias

    return connections[using or database_alias()]


def enqueue(request: ActionRequest, *, using: str | None = None) -> Action:
    """``Outbox.enqueue`` on Django's connection, inside the caller's ``transaction.atomic()``."""
    return get_outbox().enqueue(connection(using), request)


def enqueue_many(requests: Sequence[ActionRequest], *, using: str | None = None) -> list[Action]:
    return get_outbox().enqueue_many(connection(using), requests)


def admit(action_id: int, *, using: str | None = None) -> Action:
    return get_outbox().admit(connection(using), action_id)


def refuse(action_id: int, reason: str | None = None, *, using: str | None = None) -> Action:
    return get_outbox().refuse(connection(using), action_id, reason)
