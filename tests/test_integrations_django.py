"""Django: enqueue on Django's connection inside ``transaction.atomic()``, on the real database,
with Django on psycopg 3 (what Django 4.2+ picks when both are installed) and on psycopg2 (this
file again, in a process where Django's backend could only import psycopg2).

Django is set up once a process, so the project (tests/apps/django_settings.py) lives in one
schema for the whole module, and each test uses keys of its own.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from outbox import ActionRequest, ActionState, ConfigurationError, UnusableConnection
from outbox import enqueue as core_enqueue
from outbox.testing import drain

django = pytest.importorskip("django")
pytest.importorskip("psycopg2")

ROOT = Path(__file__).resolve().parent.parent
#: "psycopg2": Django's backend is made to import psycopg2 (psycopg hidden while it loads).
DRIVER = os.environ.get("OUTBOX_TEST_DJANGO_DRIVER", "psycopg")
_keys = itertools.count()


def _django_backend_on_psycopg2() -> None:
    """Django 4.2+ prefers psycopg 3 when it can import it; a project on psycopg2 is one where
    it cannot. Hidden while Django's backend loads, restored for the outbox afterwards."""
    saved = {n: m for n, m in sys.modules.items() if n == "psycopg" or n.startswith("psycopg.")}
    sys.modules.update(dict.fromkeys(saved))  # None: `import psycopg` raises ImportError
    try:
        import django.db.backends.postgresql.base  # noqa: F401
    finally:
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def project(database_url: str) -> Iterator[str]:
    schema = f"dj_{os.getpid()}"
    os.environ["OUTBOX_TEST_DJANGO_SCHEMA"] = schema
    os.environ["OUTBOX_TEST_DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.apps.django_settings"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    if DRIVER == "psycopg2":
        _django_backend_on_psycopg2()
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from tests.apps.django_feedback.models import Feedback

    call_command("outbox_migrate", verbosity=0)
    with connection.schema_editor() as editor:
        editor.create_model(Feedback)
    yield schema
    connection.close()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def thanks(key: str, **fields) -> ActionRequest:
    from tests.apps.django_feedback.effects import THANKS

    return ActionRequest(
        THANKS,
        workspace_id="w1",
        lane_key=f"feedback:{key}",
        idempotency_key=key,
        payload={"key": key},
        **fields,
    )


def key(name: str) -> str:
    return f"{name}-{next(_keys)}"


def _actions(database_url: str, schema: str, keys: list[str]) -> dict[str, str]:
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            f'SELECT idempotency_key, state FROM "{schema}".agent_action '
            "WHERE idempotency_key = ANY(%s)",
            (keys,),
        ).fetchall()
    return dict(found)


def test_django_runs_on_the_driver_this_process_was_given(project):
    from django.db import connection

    assert connection.Database.__name__ == DRIVER


def test_rollback_leaves_no_action_and_commit_leaves_exactly_one_that_runs(project, database_url):
    from django.db import transaction

    from outbox.django import enqueue, get_outbox
    from tests.apps.django_feedback.effects import thanks as adapter
    from tests.apps.django_feedback.models import Feedback

    rolled, committed = key("rolled"), key("committed")
    with pytest.raises(RuntimeError), transaction.atomic():
        Feedback.objects.create(text="rolled back")
        enqueue(thanks(rolled))
        raise RuntimeError("the view failed after the enqueue")
    with transaction.atomic():
        Feedback.objects.create(text="committed")
        action = enqueue(thanks(committed))
        assert enqueue(thanks(committed)).id == action.id  # idempotent in one transaction
    assert action.created and action.state is ActionState.ADMITTED
    assert action.payload == {"key": committed}
    assert list(Feedback.objects.values_list("text", flat=True)) == ["committed"]
    assert _actions(database_url, project, [rolled, committed]) == {committed: "ADMITTED"}
    drain(get_outbox(), timeout=60)
    assert {"key": committed} in adapter.sent and {"key": rolled} not in adapter.sent
    assert _actions(database_url, project, [committed]) == {committed: "DONE"}
    Feedback.objects.all().delete()


def test_enqueue_many_admit_and_refuse_ride_the_atomic_block(project, database_url):
    from django.db import connection, transaction

    from outbox.django import admit, enqueue, enqueue_many, refuse

    a, b, p, r = key("many"), key("many"), key("proposed"), key("refused")
    with transaction.atomic():
        many = enqueue_many([thanks(a), thanks(b), thanks(a)])
        admitted = admit(enqueue(thanks(p, proposal=True)).id)
        # The core functions take Django's connection too.
        refused = refuse(core_enqueue(connection, thanks(r, proposal=True), schema=project).id)
    assert [x.created for x in many] == [True, True, False]
    assert admitted.state is ActionState.ADMITTED and refused.state is ActionState.CANCELLED
    assert _actions(database_url, project, [a, b, p, r]) == {
        a: "ADMITTED",
        b: "ADMITTED",
        p: "ADMITTED",
        r: "CANCELLED",
    }


def test_a_savepoint_rolled_back_takes_its_action_with_it(project, database_url):
    from django.db import transaction

    from outbox.django import enqueue

    kept, dropped = key("outer"), key("inner")
    with transaction.atomic():
        enqueue(thanks(kept))
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue(thanks(dropped))
            raise RuntimeError
    assert _actions(database_url, project, [kept, dropped]) == {kept: "ADMITTED"}


def test_outside_atomic_the_connection_is_refused_and_nothing_is_written(project, database_url):
    from django.db import connection

    from outbox.django import enqueue

    lone = key("autocommit")
    with pytest.raises(UnusableConnection) as raised:
        enqueue(thanks(lone))
    assert str(raised.value) == (
        "enqueue needs a transaction on Django's connection 'default': call it inside "
        "`with transaction.atomic():` (in autocommit it would commit on its own)"
    )
    with pytest.raises(UnusableConnection, match=r"transaction\.atomic"):
        core_enqueue(connection, thanks(lone), schema=project)
    assert _actions(database_url, project, [lone]) == {}


def test_another_database_engine_is_refused_by_name(project):
    from django.db import transaction

    from outbox.django import enqueue

    with transaction.atomic(using="lite"), pytest.raises(UnusableConnection) as raised:
        enqueue(thanks(key("lite")), using="lite")
    assert str(raised.value) == (
        "enqueue cannot use Django's sqlite connection 'lite': the outbox's tables live in "
        "PostgreSQL"
    )


def test_a_database_error_marks_the_atomic_block_for_rollback(project, database_url):
    from django.db import DatabaseError, connection, transaction

    from tests.apps.django_feedback.models import Feedback

    with pytest.raises(DatabaseError), transaction.atomic():
        Feedback.objects.create(text="half done")
        with pytest.raises(connection.Database.Error):
            core_enqueue(connection, thanks(key("x")), schema="no_such_schema")
        assert connection.needs_rollback
        Feedback.objects.count()  # Django refuses to go on in a broken transaction
    assert not Feedback.objects.filter(text="half done").exists()


def test_settings_outbox_maps_to_the_outbox_settings(project, database_url):
    from django.test import override_settings

    from outbox.django import outbox_settings

    settings = outbox_settings()
    assert settings.schema == project and settings.lease == timedelta(seconds=120)
    params = psycopg.conninfo.conninfo_to_dict(settings.require_database_url())
    assert params["options"] == f"-c search_path={project}"
    with psycopg.connect(settings.require_database_url()) as conn:
        assert conn.execute("SELECT current_schema()").fetchone() == (project,)
    with override_settings(OUTBOX={"schema": "other", "write_margin": timedelta(seconds=7)}):
        other = outbox_settings()
    assert (other.schema, other.write_margin) == ("other", timedelta(seconds=7))
    with override_settings(OUTBOX={"LEASE_SECONDS": 5}), pytest.raises(ConfigurationError) as e:
        outbox_settings()
    assert "no key 'LEASE_SECONDS'" in str(e.value)


def test_manage_py_outbox_runs_a_command_on_the_projects_database(project, capsys):
    import json

    from django.core.management import ManagementUtility, call_command
    from django.db import transaction

    from outbox.django import enqueue

    call_command("outbox_migrate")
    assert f"outbox schema {project}: applied nothing (up to date)" in capsys.readouterr().out
    with transaction.atomic():
        enqueue(thanks(key("counted")))
    # No --database-url nor --schema: both come from DATABASES and settings.OUTBOX.
    ManagementUtility(["manage.py", "outbox", "status", "--json"]).execute()
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["THANKS"]["ADMITTED"] >= 1


@pytest.mark.skipif(DRIVER == "psycopg2", reason="this is the psycopg2 run itself")
def test_the_same_tests_pass_with_django_on_psycopg2(database_url):
    env = {
        **os.environ,
        "OUTBOX_TEST_DJANGO_DRIVER": "psycopg2",
        "OUTBOX_TEST_DATABASE_URL": database_url,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
