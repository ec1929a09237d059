"""Rate limits and concurrency caps: what a kind declares, what settings override, and the
checks that refuse hostile values before anything runs.

A ``Rate`` is "``count`` per ``per``"; the outbox spaces the calls it allows evenly (one every
``per / count``), so no window of ``per`` ever holds more than ``count`` of them. ``KindLimits``
gathers a kind's four limits: a rate and a concurrency cap for the whole kind, and the same two
for each limit key (the action's ``limit_key``, by default its workspace).

Settings (``OUTBOX_LIMITS``) override a kind's declaration field by field, one clause a kind::

    OUTBOX_LIMITS="EMAIL: rate=14/s, key_concurrency=10; WEBHOOK: key_rate=100/m"
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import timedelta

from outbox.errors import ConfigurationError
from outbox.kinds import is_kind_name

#: A rate may not space its calls closer than this: PostgreSQL keeps microseconds, and a
#: tighter limit is no limit at all.
MIN_SPACING = timedelta(microseconds=100)
#: Nor further than this (a rate of one a week is a schedule, not a rate limit).
MAX_PER = timedelta(days=1)
#: The most calls a rate may allow a period, and the highest concurrency cap.
MAX_COUNT = 1_000_000

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|min|m|h|d)\s*")


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` calls per ``per``, spaced evenly: ``Rate(14, timedelta(seconds=1))``, or
    ``Rate.parse("14/s")``."""

    count: int
    per: timedelta

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise ValueError(f"rate count must be an integer, not {self.count!r}")
        if not 1 <= self.count <= MAX_COUNT:
            raise ValueError(f"rate count must be from 1 to {MAX_COUNT:,}, not {self.count}")
        if not isinstance(self.per, timedelta) or self.per <= timedelta(0):
            raise ValueError(f"rate interval must be a positive timedelta, not {self.per!r}")
        if self.per > MAX_PER:
            raise ValueError(f"rate interval must be at most {MAX_PER}, not {self.per}")
        if self.spacing < MIN_SPACING:
            raise ValueError(
                f"rate {self.count}/{self.per.total_seconds()}s spaces calls less than "
                f"{MIN_SPACING.total_seconds() * 1000} ms apart"
            )

    @property
    def spacing(self) -> timedelta:
        """The time between two calls the rate allows, rounded up to the microsecond (rounded
        down, ``count`` slots would span a little less than ``per``)."""
        micros = -(-(self.per // timedelta(microseconds=1)) // self.count)
        return timedelta(microseconds=micros)

    @property
    def per_second(self) -> float:
        return self.count / self.per.total_seconds()

    @classmethod
    def parse(cls, text: str) -> Rate:
        """``"50/s"``, ``"14/1s"``, ``"100/m"``, ``"3000/h"``, ``"10/2.5s"``, ``"5/500ms"``."""
        match = _RATE.fullmatch(text)
        if match is None:
            raise ValueError(f"{text!r} is not a rate: write COUNT/UNIT, e.g. 50/s, 100/m, 10/2.5s")
        count, amount, unit = match.groups()
        seconds = float(amount or 1) * _UNITS[unit]
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"{text!r}: the interval must be more than zero")
        return cls(int(count), timedelta(seconds=seconds))

    def __str__(self) -> str:
        return f"{self.count}/{self.per.total_seconds():g}s"


def _check_cap(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"{name} must be an integer from 1 to {MAX_COUNT:,}, not {value!r}")


@dataclass(frozen=True, slots=True)
class KindLimits:
    """A kind's limits; None means unlimited.

    ``rate``: calls of the whole kind, across every worker. ``key_rate``: calls of one limit key.
    ``concurrency``: actions of the kind claimed and unfinished at once (below the claimer's
    ``in_flight``). ``key_concurrency``: the same for one limit key (an SMTP relay's connections
    per account).
    """

    rate: Rate | None = None
    key_rate: Rate | None = None
    concurrency: int | None = None
    key_concurrency: int | None = None

    def __post_init__(self) -> None:
        for name in ("rate", "key_rate"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Rate):
                raise ValueError(f"{name} must be a Rate (Rate.parse('50/s')), not {value!r}")
        _check_cap("concurrency", self.concurrency)
        _check_cap("key_concurrency", self.key_concurrency)

    @property
    def rated(self) -> bool:
        return self.rate is not None or self.key_rate is not None

    def in_flight_bound(self, in_flight: int) -> int:
        """The most actions of the kind a claimer keeps claimed: ``in_flight``, lowered by the
        concurrency cap, and by what the kind's rate runs in ``RATE_HORIZON`` (more would only
        sleep on their slots, holding workers and their leases)."""
        bound = in_flight if self.concurrency is None else min(in_flight, self.concurrency)
        if self.rate is not None:
            bound = min(bound, max(1, math.ceil(self.rate.per_second * RATE_HORIZON)))
        return bound

    def overridden_by(self, other: KindLimits, given: Iterable[str]) -> KindLimits:
        """These limits with the fields named in ``given`` taken from ``other``."""
        return replace(self, **{name: getattr(other, name) for name in given})

    def describe(self) -> str:
        parts = [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) is not None
        ]
        return ", ".join(parts) or "none"


NO_LIMITS = KindLimits()
_FIELDS = {"rate", "key_rate", "concurrency", "key_concurrency"}


def parse_limits(text: str) -> dict[str, tuple[KindLimits, frozenset[str]]]:
    """``OUTBOX_LIMITS``: per kind, its limits and the names of the fields the text sets (the
    rest keep the kind's declaration). ``none`` as a value lifts a declared limit. Raises
    ``ConfigurationError`` naming the clause at fault."""
    out: dict[str, tuple[KindLimits, frozenset[str]]] = {}
    for clause in (c.strip() for c in text.split(";")):
        if not clause:
            continue
        kind, sep, body = clause.partition(":")
        kind = kind.strip()
        if not sep or not is_kind_name(kind):
            raise ConfigurationError(
                f"OUTBOX_LIMITS: {clause!r} must read KIND: name=value, ..."
                " (KIND in UPPER_SNAKE_CASE)"
            )
        if kind in out:
            raise ConfigurationError(f"OUTBOX_LIMITS: kind {kind} is given twice")
        values: dict[str, object] = {}
        for item in (i.strip() for i in body.split(",")):
            name, eq, raw = (part.strip() for part in item.partition("="))
            if not eq or name not in _FIELDS:
                raise ConfigurationError(
                    f"OUTBOX_LIMITS: {kind}: {item!r} must be one of "
                    f"{', '.join(sorted(_FIELDS))} = value"
                )
            try:
                if raw.lower() == "none":
                    values[name] = None
                elif name.endswith("rate"):
                    values[name] = Rate.parse(raw)
                else:
                    values[name] = int(raw)
            except ValueError as error:
                raise ConfigurationError(f"OUTBOX_LIMITS: {kind}: {name}: {error}") from None
        try:
            limits = KindLimits(**values)  # type: ignore[arg-type]
        except ValueError as error:
            raise ConfigurationError(f"OUTBOX_LIMITS: {kind}: {error}") from None
        out[kind] = (limits, frozenset(values))
    return out


def effective_limits(
    declared: Mapping[str, KindLimits], settings_text: str
) -> dict[str, KindLimits]:
    """Each kind's limits: its declaration, with what ``OUTBOX_LIMITS`` sets for it on top. A
    kind named only in the settings gets the settings' limits."""
    out = dict(declared)
    for kind, (limits, given) in parse_limits(settings_text).items():
        out[kind] = out.get(kind, NO_LIMITS).overridden_by(limits, given)
    return {kind: limits for kind, limits in out.items() if limits != NO_LIMITS}


#: Separates the kind from the key in a rate bucket's name (a control character no kind name
#: holds and a key is unlikely to begin with).
BUCKET_SEPARATOR = "\x1f"


#: A rate-limited kind keeps at most this many seconds of its rate claimed (the claimer's bound).
RATE_HORIZON = 2.0
#: Slots are spaced this much wider than ``per / count``: a call reaches the provider a few
#: milliseconds after its slot, never exactly at it, and two calls ``count`` slots apart whose
#: delays differ must still be ``per`` apart at the provider. 3% of a second is 30 ms of
#: tolerance; a limit of 50/s runs at 48.5/s.
RATE_GUARD = 0.03


def rate_buckets(kind: str, limit_key: str, limits: KindLimits) -> list[tuple[str, timedelta]]:
    """The buckets an action of ``kind`` with ``limit_key`` draws a slot from, with their
    spacing (guarded): the kind's, and its key's."""
    buckets: list[tuple[str, timedelta]] = []
    if limits.rate is not None:
        buckets.append((kind, limits.rate.spacing * (1 + RATE_GUARD)))
    if limits.key_rate is not None:
        spacing = limits.key_rate.spacing * (1 + RATE_GUARD)
        buckets.append((f"{kind}{BUCKET_SEPARATOR}{limit_key}", spacing))
    return buckets
