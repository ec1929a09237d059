"""Finds the application's ``Outbox`` from ``module:object`` (as ``dramatiq`` finds a broker)."""

from __future__ import annotations

import importlib
import sys

from outbox.errors import ConfigurationError
from outbox.outbox import Outbox


def load_app(spec: str) -> Outbox:
    """``pkg.module:name`` -> the ``Outbox`` it names (or that calling it returns).

    ``pkg.module`` alone looks for an attribute named ``outbox``.
    """
    module_name, _, attr = spec.partition(":")
    if "." not in sys.path and "" not in sys.path:
        sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ConfigurationError(
            f"cannot import {module_name!r} (from {spec!r}): {error}"
        ) from error
    obj = getattr(module, attr or "outbox", None)
    if obj is None:
        raise ConfigurationError(f"{module_name!r} has no attribute {attr or 'outbox'!r}")
    if not isinstance(obj, Outbox) and callable(obj):
        obj = obj()
    if not isinstance(obj, Outbox):
        raise ConfigurationError(f"{spec!r} is a {type(obj).__name__}, not an outbox.Outbox")
    return obj
