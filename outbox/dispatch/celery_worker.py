"""The Celery worker entry of the outbox.

    OUTBOX_APP=myapp.outbox:outbox celery -A outbox.dispatch.celery_worker worker \
        -Q outbox.email,outbox.webhook

imports the application's ``Outbox``, registers one task per kind on the Celery app of
``OUTBOX_CELERY_APP`` (else one on ``OUTBOX_BROKER_URL``) and names it ``app``, which is what
``celery -A`` runs. ``outbox worker APP --fabric celery`` is a wrapper around that command. A
shop with its own Celery app calls ``outbox.celery.install(outbox, app)`` in its own module
instead and runs its own ``celery -A myapp worker``.
"""

from typing import Any

from celery import signals

from outbox.dispatch.celery_fabric import install
from outbox.dispatch.entry import app_from_env
from outbox.logs import apply_log_format

dispatch = install(app_from_env())
app = dispatch.app


@signals.after_setup_logger.connect(weak=False)
def _log_format(**_: Any) -> None:
    # Celery sets up the worker's logging after it imported this module.
    apply_log_format()
