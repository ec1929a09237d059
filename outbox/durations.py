"""How long something lasted or has left, in words an operator reads at a glance: ``45s``,
``2m 5s``, ``1h 2m`` (the seconds drop out once it is hours). ``outbox status`` and the
console say every duration this way."""

from __future__ import annotations


def say_duration(seconds: float) -> str:
    """``seconds`` (a negative one counts as none) as ``45s``, ``2m 5s`` or ``1h 2m``."""
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m {whole % 60}s"
    return f"{whole // 3600}h {whole % 3600 // 60}m"
