"""Serving the console with waitress (a production WSGI server: a thread pool, request
buffering, no wsgiref), after checking that it may listen where it is asked to."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask
from waitress.server import create_server

from outbox.console.auth import check_bind

log = logging.getLogger("outbox.console")

#: Requests served at once; each holds at most one pooled connection while it reads.
THREADS = 8


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8080, threads: int = THREADS) -> Any:
    """A waitress server for ``app`` (call ``run()``, stop with ``close()``); the bound port is
    ``effective_port``. Refuses (``ConfigurationError``) to listen beyond loopback when the app
    has no logins."""
    check_bind(host, app.extensions["outbox"]["users"])
    return create_server(app, host=host, port=port, threads=threads, ident="outbox-console")
