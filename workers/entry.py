"""The Dramatiq worker entry as the repo's deployable folder names it:

    OUTBOX_APP=myapp.outbox:outbox dramatiq workers.entry --processes 2 --threads 8

is the same command as ``dramatiq outbox.dispatch.worker`` (the installed package's own entry,
which ``outbox worker APP`` runs); this folder is not part of the wheel.
"""

from outbox.dispatch.worker import broker, dispatch

__all__ = ["broker", "dispatch"]
