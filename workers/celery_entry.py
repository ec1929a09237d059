"""The Celery worker entry as the repo's deployable folder names it:

    OUTBOX_APP=myapp.outbox:outbox celery -A workers.celery_entry worker -Q outbox.email

is the same command as ``celery -A outbox.dispatch.celery_worker worker`` (which ``outbox worker
APP --fabric celery`` runs); this folder is not part of the wheel.
"""

from outbox.dispatch.celery_worker import app, dispatch

__all__ = ["app", "dispatch"]
