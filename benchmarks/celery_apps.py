"""The Celery app of ``celery-raw``: ``celery -A benchmarks.celery_apps:raw worker`` runs one
plain no-op task (the raw Dramatiq actor's work: a Redis INCR) on the outbox's own Celery app
settings (``outbox_app``) and task options (``task_options``), without the outbox."""

from __future__ import annotations

import os

from benchmarks.apps import outbox_app, raw_noop
from benchmarks.common import REDIS_URL, RUN_ID
from outbox.dispatch.celery_fabric import outbox_app as outbox_celery_app
from outbox.dispatch.celery_fabric import task_options

#: The raw task's queue and name (the outbox's queue is ``NOOP.queue_name``).
RAW_QUEUE = f"bench.celeryraw.{RUN_ID}"
RAW_TASK = "bench_raw_celery_noop"

raw = outbox_celery_app(os.environ.get("OUTBOX_BROKER_URL", REDIS_URL))
raw_task = raw.task(name=RAW_TASK, **task_options(outbox_app()))(raw_noop)
