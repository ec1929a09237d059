"""Structured log lines: the outbox logs with ``extra`` fields (``event``, ``action_id``, ``kind``,
``reason``, counts); ``JsonFormatter`` prints each record as one JSON object with those fields.

What the outbox logs is chosen so that a line never carries a payload, an address or a
credential: ids, kinds, states, reasons, counts and exception class names only.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

#: Set ``OUTBOX_LOG_FORMAT=json`` to get one JSON object per line from every process the outbox
#: starts: the CLI's own, the claimer, and a worker pool's Dramatiq master, worker and fork
#: processes (the variable is inherited; each of them applies it).
LOG_FORMAT_ENV = "OUTBOX_LOG_FORMAT"

# Attributes every LogRecord has; whatever else a record carries came in through ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a log call passed in ``extra``."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
            **extra_fields(record),
        }
        if record.exc_info and record.exc_info[0] is not None:
            # The class only: an exception's text may quote a payload or an address.
            line["exception"] = record.exc_info[0].__name__
        return json.dumps(line, default=str)


def json_chosen(fmt: str | None = None) -> bool:
    """Whether ``fmt`` (else ``$OUTBOX_LOG_FORMAT``) asks for JSON lines."""
    return (fmt or os.environ.get(LOG_FORMAT_ENV, "text")).strip().lower() == "json"


def apply_log_format(fmt: str | None = None) -> None:
    """In a process whose logging someone else set up (Dramatiq's master, worker and fork
    processes write through pipes the master relays): keep every root handler and its stream,
    and give it the JSON formatter when JSON is chosen."""
    if json_chosen(fmt):
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())


def configure_logging(verbose: bool = False, fmt: str | None = None) -> None:
    """Root logging for an outbox process: JSON lines when ``fmt`` (or ``$OUTBOX_LOG_FORMAT``) is
    ``json``, else plain text."""
    level = logging.DEBUG if verbose else logging.INFO
    if json_chosen(fmt):
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler], force=True)
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
