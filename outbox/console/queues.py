"""dramatiq-dashboard under ``/queues``, for a Redis broker: what the broker holds now. Its
pages get a banner saying so against the console (PostgreSQL's truth), with a link back."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.wrappers import Response

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

BANNER = (
    '<div style="font:14px system-ui,sans-serif;background:#fff8c5;border-bottom:1px solid '
    '#d4a72c;padding:8px 16px">Broker queues: the messages Redis holds now (claims on their way '
    "to a worker). The outbox's truth is PostgreSQL: every action, its state and its attempts "
    'are in <a href="/">the console</a>. <a href="/">&larr; back to the console</a></div>'
)


def queues_app(broker: Any) -> WSGIApp | None:
    """dramatiq-dashboard's WSGI app for a Redis broker, else None (RabbitMQ, or the package
    is not installed)."""
    if broker is None:
        return None
    try:
        from dramatiq.brokers.redis import RedisBroker
        from dramatiq_dashboard import DashboardApp as QueuesApp
    except ImportError:
        return None
    if not isinstance(broker, RedisBroker):
        return None
    app: WSGIApp = QueuesApp(broker=broker, prefix="/queues")
    return app


def serve_queues(app: WSGIApp, environ: dict[str, Any]) -> Response:
    """One request to dramatiq-dashboard, its HTML with the banner after ``<body>``."""
    inner = {**environ, "PATH_INFO": environ["PATH_INFO"][len("/queues") :] or "/"}
    response = Response.from_app(app, inner, buffered=True)
    if response.mimetype == "text/html":
        body = response.get_data(as_text=True)
        head, sep, tail = body.partition("<body>")
        if sep:
            response.set_data(head + sep + BANNER + tail)
    return response
