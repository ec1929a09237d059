"""Which Dramatiq broker the outbox pushes to and consumes from.

Chosen, in this order: the broker the application handed to ``install`` (an existing Dramatiq
shop), a broker built from ``OUTBOX_BROKER_URL`` (``redis://`` or ``amqp://``), the global
broker the application set with ``dramatiq.set_broker``, and else Redis on the local machine.
"""

from __future__ import annotations

from urllib.parse import urlparse

import dramatiq
import dramatiq.broker
from dramatiq import Broker
from dramatiq.middleware import Middleware

from outbox.config import RABBITMQ_SCHEMES, REDIS_SCHEMES
from outbox.errors import ConfigurationError

#: The broker used when nothing names one: Redis is the outbox's default broker.
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"

_REDIS_SCHEMES = REDIS_SCHEMES
_RABBITMQ_SCHEMES = RABBITMQ_SCHEMES


def broker_from_url(url: str, *, middleware: list[Middleware] | None = None) -> Broker:
    """A ``RedisBroker`` for ``redis://``, ``rediss://`` and ``unix://`` URLs, a ``RabbitmqBroker``
    for ``amqp://`` and ``amqps://``; Dramatiq's default middleware unless ``middleware`` is given.

    RabbitMQ publishes with confirmed delivery, so a push that returns is held by the broker.
    """
    scheme = urlparse(url).scheme
    if scheme in _REDIS_SCHEMES:
        from dramatiq.brokers.redis import RedisBroker

        return RedisBroker(url=url, middleware=middleware)
    if scheme in _RABBITMQ_SCHEMES:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        return RabbitmqBroker(url=url, middleware=middleware, confirm_delivery=True)
    raise ConfigurationError(
        f"OUTBOX_BROKER_URL: {url!r} is neither redis:// (the default broker) nor amqp://"
    )


def default_broker(broker_url: str | None) -> Broker:
    """The broker when the application handed none to ``install``: from ``broker_url`` if given,
    else the global broker the application set, else local Redis."""
    if broker_url:
        return broker_from_url(broker_url)
    if dramatiq.broker.global_broker is not None:
        return dramatiq.get_broker()
    return broker_from_url(DEFAULT_BROKER_URL)
