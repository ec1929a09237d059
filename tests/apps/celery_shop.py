"""An existing Celery shop: its own app, its own task on its own queue, and the outbox's tasks
added in one line. ``celery -A tests.apps.celery_shop worker -Q shop_<suffix>,outbox.rb_<suffix>``
runs both. Environment as ``dispatch_app`` (``OUTBOX_*``, ``DISPATCH_APP_SUFFIX``)."""

from __future__ import annotations

import os

import psycopg
from celery import Celery

import outbox.celery
from tests.apps import dispatch_app

app = Celery("shop", broker=os.environ["OUTBOX_BROKER_URL"], set_as_current=False)
app.conf.update(task_ignore_result=True, worker_prefetch_multiplier=1)

_schema = os.environ["OUTBOX_SCHEMA"]
_database_url = os.environ["OUTBOX_DATABASE_URL"]


@app.task(name=f"shop_note_{os.environ['DISPATCH_APP_SUFFIX'].lower()}")
def shop_note(note: str) -> None:
    with psycopg.connect(_database_url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{_schema}".dispatch_shop (note) VALUES (%s)', (note,))


# The one line a shop adds.
outbox.celery.install(dispatch_app.make_outbox(), app)
