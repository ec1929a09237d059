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

#: Redis socket bounds: a connect, or a command on a Redis that stalls, fails after this long
#: instead of holding its thread for ever (a push thread of the claimer, a worker's consumer).
REDIS_CONNECT_TIMEOUT = 5.0
REDIS_SOCKET_TIMEOUT = 10.0

_REDIS_SCHEMES = REDIS_SCHEMES
_RABBITMQ_SCHEMES = RABBITMQ_SCHEMES


def broker_from_url(url: str, *, middleware: list[Middleware] | None = None) -> Broker:
    """A ``RedisBroker`` for ``redis://``, ``rediss://`` and ``unix://`` URLs (one whose idle
    consumers wake on a push, ``outbox.dispatch.wake``), a ``RabbitmqBroker`` for ``amqp://``
    and ``amqps://``; Dramatiq's default middleware unless ``middleware`` is given.

    RabbitMQ publishes with confirmed delivery, so a push that returns is held by the broker.
    A URL that does not parse is refused with a ``ConfigurationError`` naming the setting.
    """
    try:
        scheme = urlparse(url).scheme
        if scheme in _REDIS_SCHEMES:
            import redis

            from outbox.dispatch.wake import WakingRedisBroker, waking_redis_broker_class

            pool = redis.ConnectionPool.from_url(
                url,
                socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
                socket_timeout=REDIS_SOCKET_TIMEOUT,
            )
            # Its idle consumers wait for the claimer's wake-up instead of polling blind.
            broker_class = waking_redis_broker_class()
            broker = broker_class(client=redis.Redis(connection_pool=pool), middleware=middleware)
            if isinstance(broker, WakingRedisBroker):
                broker.url = url  # the claimer's loop pushes over a client of its own
            return broker
        if scheme in _RABBITMQ_SCHEMES:
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            return RabbitmqBroker(url=url, middleware=middleware, confirm_delivery=True)
    except (ValueError, TypeError) as error:
        raise ConfigurationError(
            f"OUTBOX_BROKER_URL: {_redacted(url)!r} is malformed ({error})"
        ) from None
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


def _redacted(url: str) -> str:
    """``url`` without its password, for an error message."""
    try:
        parsed = urlparse(url)
        if parsed.password:
            return url.replace(f":{parsed.password}@", ":***@", 1)
    except ValueError:
        pass
    return url
