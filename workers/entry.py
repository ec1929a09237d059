"""The Dramatiq worker entry of the outbox.

    OUTBOX_APP=myapp.outbox:outbox dramatiq workers.entry --processes 2 --threads 8

imports the application's ``Outbox``, joins one actor per kind to the broker (from
``OUTBOX_BROKER_URL``, or the broker the application installed the outbox on) and sets it as
Dramatiq's broker, which is what ``dramatiq workers.entry`` then runs. ``outbox worker APP`` is
a wrapper around exactly that command.
"""

from outbox.dispatch.entry import dispatch_from_env

dispatch = dispatch_from_env()
#: ``dramatiq workers.entry:broker`` names it explicitly.
broker = dispatch.broker
