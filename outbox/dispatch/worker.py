"""The Dramatiq worker entry of the outbox.

    OUTBOX_APP=myapp.outbox:outbox dramatiq outbox.dispatch.worker --processes 2 --threads 8

imports the application's ``Outbox``, joins one actor per kind to the broker (from
``OUTBOX_BROKER_URL``, or the broker the application installed the outbox on) and sets it as
Dramatiq's broker, which is what ``dramatiq outbox.dispatch.worker`` then runs. ``outbox worker
APP`` is a wrapper around exactly that command. Each worker process imports this module after
Dramatiq set up its logging, so ``OUTBOX_LOG_FORMAT`` applies here whatever the start method.
"""

from outbox.dispatch.entry import dispatch_from_env
from outbox.logs import apply_log_format

apply_log_format()
dispatch = dispatch_from_env()
#: ``dramatiq outbox.dispatch.worker:broker`` names it explicitly.
broker = dispatch.broker
