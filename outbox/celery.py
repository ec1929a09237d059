"""The outbox for an existing Celery app, in one line:

    # myapp/celery.py
    app = Celery("myapp", broker="redis://...")
    outbox.celery.install(outbox, app)

registers one task per kind (on the kind's own queue), so ``celery -A myapp worker -Q
outbox.email`` runs the email adapter, and ``outbox claimer myapp.outbox:outbox --fabric celery
--celery-app myapp.celery:app`` pushes the claimed actions to it. See docs/celery.md.
"""

from outbox.dispatch.celery_fabric import (
    TASK_PREFIX,
    CeleryDispatch,
    app_from_settings,
    install,
    installed,
)

__all__ = ["TASK_PREFIX", "CeleryDispatch", "app_from_settings", "install", "installed"]
