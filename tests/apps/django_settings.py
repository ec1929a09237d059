"""A minimal Django project for the integration tests: the real PostgreSQL of the tests, in a
schema of its own (``OUTBOX_TEST_DJANGO_SCHEMA``, set by the test before ``django.setup()``)
through the connection's search_path; the outbox in that schema too."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_url = os.environ.get("OUTBOX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
_params = conninfo_to_dict(_url)
SCHEMA = os.environ.get("OUTBOX_TEST_DJANGO_SCHEMA", "django_test")

SECRET_KEY = "only-for-tests"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["outbox.django", "tests.apps.django_feedback"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _params.get("dbname", "test"),
        "USER": _params.get("user", "postgres"),
        "PASSWORD": _params.get("password", ""),
        "HOST": _params.get("host", "127.0.0.1"),
        "PORT": _params.get("port", "5432"),
        "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
    },
    # Another alias on another database engine: the outbox refuses it by name.
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
OUTBOX = {
    "APP": "tests.apps.django_feedback.effects:outbox",
    "SCHEMA": SCHEMA,
    "LEASE": 120,
}
