"""The event loop of the outbox's own processes (``OUTBOX_EVENT_LOOP``): uvloop where it is
installed, asyncio's own loop when told or where uvloop is missing, and a clear error for a
loop that cannot run."""

from __future__ import annotations

import asyncio
import sys

import pytest

from outbox import ConfigurationError, Settings
from outbox.event_loop import loop_factory, loop_name, run


async def _running_loop_name() -> str:
    return loop_name(asyncio.get_running_loop())


def test_auto_runs_uvloop_where_it_is_installed() -> None:
    pytest.importorskip("uvloop")
    assert run(_running_loop_name()) == "uvloop"
    assert run(_running_loop_name(), "uvloop") == "uvloop"


def test_asyncio_runs_asyncios_own_loop() -> None:
    assert run(_running_loop_name(), "asyncio") == "asyncio"


def test_auto_falls_back_to_asyncio_where_uvloop_is_missing(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert run(_running_loop_name(), "auto") == "asyncio"


def test_uvloop_asked_for_where_it_is_missing_is_a_configuration_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ConfigurationError, match="uvloop is not installed"):
        loop_factory("uvloop")
    with pytest.raises(ConfigurationError, match="uvloop is not installed"):
        Settings.from_env({"OUTBOX_EVENT_LOOP": "uvloop"})


def test_an_unknown_loop_is_refused_when_the_settings_load() -> None:
    with pytest.raises(ConfigurationError, match="OUTBOX_EVENT_LOOP: 'trio' is not one of"):
        Settings.from_env({"OUTBOX_EVENT_LOOP": "trio"})
