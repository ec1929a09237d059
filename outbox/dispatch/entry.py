"""Builds the worker side for the application named by ``OUTBOX_APP`` (for the worker entries,
``outbox.dispatch.worker`` and ``outbox.dispatch.celery_worker``)."""

from __future__ import annotations

import os

import dramatiq

from outbox.dispatch.actors import Dispatch, install
from outbox.errors import ConfigurationError
from outbox.loader import load_app
from outbox.outbox import Outbox

#: The environment variable naming the application's ``module:object``.
APP_ENV = "OUTBOX_APP"


def app_from_env() -> Outbox:
    """The application's ``Outbox`` named by ``$OUTBOX_APP``."""
    spec = os.environ.get(APP_ENV)
    if not spec:
        raise ConfigurationError(
            f"set {APP_ENV} to the module:object of the application's Outbox "
            f"(e.g. {APP_ENV}=myapp.outbox:outbox dramatiq outbox.dispatch.worker)"
        )
    return load_app(spec)


def dispatch_from_env() -> Dispatch:
    """Loads ``$OUTBOX_APP``, installs its actors (on the broker the app installed them on, else
    the one from the environment) and makes that broker Dramatiq's global broker."""
    dispatch = install(app_from_env())
    dramatiq.set_broker(dispatch.broker)
    return dispatch
