"""The outbox console (``outbox dashboard``, also ``outbox console``): a web UI over PostgreSQL's
truth for the person on call. Actions filtered and keyset-paged, one action with its attempts,
provider reference, resolution and links; UNCERTAIN with Message-IDs; blocked lanes and why;
live claimers and workers; outcomes per minute; and the operator's verbs (``outbox.operator``)
as CSRF-protected POSTs under a login. Pages: ``views`` (reads), ``acting`` (verbs); ``auth``,
``csrf``; ``reads`` (its SQL); ``chart``; ``health``; ``queues`` (dramatiq-dashboard);
``server`` (waitress)."""

from __future__ import annotations

from outbox.console.app import create_app
from outbox.console.server import serve

__all__ = ["create_app", "serve"]
