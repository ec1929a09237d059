"""A kind's provider outage: actions ride it out instead of spending their attempts.

An adapter answers ``Retry`` when its provider proved it holds nothing, and each such attempt
counts toward the action's ``max_attempts``. One action's attempts ending ``Retry`` say little
(its own input may be what the provider refuses); several actions' attempts of one kind ending
``Retry`` with no DONE of the kind between them say its provider is down. A row a kind keeps
that count: the distinct actions whose attempts ended ``Retry`` since the kind's last DONE, and
the first one's time (``provider_outage_note`` in ``sql/queries.sql``, written after a finish
statement whose rows call for it: ``outage_note``). Only a ``Retry`` the adapter returned
counts: an exception the executor turned into a retry says nothing of the provider (an
adapter's bug raises for every action alike).

While ``Settings.outage_threshold`` distinct actions or more are in it, and the first of them
ended less than ``Settings.outage_limit`` ago, an attempt that would end FAILED
``ATTEMPTS_EXHAUSTED`` gives its attempt back instead (``ride_out``): the action waits its last
backoff again and tries once more, for as long as the outage lasts, up to the limit. An action
that allows a single attempt (``max_attempts=1``) is never tried again, outage or not. The
first DONE of the kind ends the outage. Only the attempt that would exhaust asks (one query),
and only a finish statement that ended a retry, or a DONE of a kind whose row holds retries,
writes the row: while every provider answers, the finishes read an empty table and write
nothing more.

Once the kind counts as down, claims hold it too (``Settings.outage_hold``): a finish statement
whose retries find the kind down and not held holds it (``holds_called_for``), and claims skip a
held kind as they skip a paused one, so its actions wait without calling the provider or
spending attempts. When the hold ends, claims take one action of the kind at a time (a probe,
``claim_heads``): its DONE ends the outage and the hold, and the rest follow; its retry holds
the kind again, each hold twice the last up to ``HOLD_CEILING`` times the first. So a down
provider takes about one call a hold instead of one an action a backoff, and the first call
after it is back succeeds and the outage ends by itself. Past ``Settings.outage_limit`` the kind
is released (claims take it as before, and attempts count). An operator who knows the provider
is down for long pauses the kind instead (``outbox pause``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from outbox.results import Finish, backoff
from outbox.state import ActionState, StopReason

if TYPE_CHECKING:
    from outbox.action import Action
    from outbox.config import Settings

#: The most distinct actions an outage row keeps (``provider_outage_note``): the threshold's
#: ceiling.
MAX_THRESHOLD = 16
#: ``Settings.outage_threshold``, ``Settings.outage_limit`` and ``Settings.outage_hold`` unless
#: configured.
DEFAULT_THRESHOLD = 5
DEFAULT_LIMIT = timedelta(hours=24)
DEFAULT_HOLD = timedelta(seconds=5)
#: The longest hold, in first holds: each hold of one outage is twice the last, up to this many
#: times the first (a minute at the default). A provider back from an outage waits at most
#: this long for its next call.
HOLD_CEILING = 12


@dataclass(frozen=True, slots=True)
class OutageRule:
    """When a kind's provider counts as down (``verdict``), and how long a hold of it
    starts (a zero ``hold``: no hold). ``Settings.outage_rule`` gives the configured one."""

    threshold: int = DEFAULT_THRESHOLD
    limit: timedelta = DEFAULT_LIMIT
    hold: timedelta = DEFAULT_HOLD

    def verdict(self, actions: int, retrying_for: float) -> OutageVerdict:
        """The one rule of "counts as down", for the executor (``Store.provider_down``), ``outbox
        status`` and the console alike: ``actions`` distinct actions of a kind retried since its
        last DONE, the first ``retrying_for`` seconds ago (both read off the database and its
        clock)."""
        if not 0 < self.threshold <= actions:
            return OutageVerdict.RETRYING
        if retrying_for < self.limit.total_seconds():
            return OutageVerdict.DOWN
        return OutageVerdict.PAST_LIMIT

    def down(self, row: dict[str, Any]) -> bool:
        """Whether an outage row's numbers (``actions``, ``retrying_for``) say down."""
        verdict = self.verdict(int(row["actions"]), float(row["retrying_for"]))
        return verdict is OutageVerdict.DOWN

    def hold_for(self, holds: int) -> timedelta:
        """The length of a kind's next hold after ``holds`` holds in the same outage."""
        return self.hold * min(2 ** min(holds, 16), HOLD_CEILING)


#: The rule of the default settings.
DEFAULT_RULE = OutageRule()


def holds_called_for(rows: Iterable[dict[str, Any]], rule: OutageRule) -> dict[str, Any] | None:
    """The ``provider_outage_hold`` that the rows a ``provider_outage_note`` returned call for:
    each kind down by ``rule`` and not held now, with its next hold's length; and each kind
    held before that no longer counts as down (past ``rule.limit``), released (a NULL length).
    None for neither (and always when ``rule.hold`` is zero)."""
    if not rule.hold:
        return None
    changes: list[tuple[str, timedelta | None]] = []
    for row in rows:
        if row["held"] or not row["actions"]:
            continue
        if rule.down(row):
            changes.append((row["kind"], rule.hold_for(int(row["holds"]))))
        elif row["holds"]:
            changes.append((row["kind"], None))
    if not changes:
        return None
    from outbox.binary_arrays import IntervalArray, TextArray

    changes.sort(key=lambda change: change[0])
    return {
        "kinds": TextArray([kind for kind, _ in changes]),
        "fors": IntervalArray([hold for _, hold in changes]),
    }


class OutageVerdict(enum.Enum):
    """What a kind's outage row says of its provider, under a threshold and a limit."""

    #: Fewer distinct actions retried than the threshold (or the threshold is 0, off): their
    #: attempts count as without an outage.
    RETRYING = "retrying"
    #: Down: an exhausting attempt gives its attempt back.
    DOWN = "down"
    #: Down for longer than the limit: attempts count again.
    PAST_LIMIT = "past_limit"

    @property
    def badge(self) -> str:
        """Its few words, as the console's overview shows them beside the kind."""
        return _BADGES[self]

    @property
    def consequence(self) -> str:
        """What it means for the kind's actions, as ``outbox status`` says it ('' for
        RETRYING, which changes nothing)."""
        return _CONSEQUENCES[self]


_BADGES = {
    OutageVerdict.RETRYING: "provider retrying",
    OutageVerdict.DOWN: "provider down",
    OutageVerdict.PAST_LIMIT: "provider down past its limit",
}
_CONSEQUENCES = {
    OutageVerdict.RETRYING: "",
    OutageVerdict.DOWN: "provider down, its actions keep their last attempt until a DONE",
    OutageVerdict.PAST_LIMIT: (
        "provider down past OUTBOX_OUTAGE_LIMIT_SECONDS, attempts count again"
    ),
}


def outage_note(
    written: Iterable[tuple[int, Finish, str | None]],
) -> dict[str, Any] | None:
    """The ``provider_outage_note`` a finish statement calls for, from each written finish's
    action id, finish and ``outage_kind`` (named only for a retry, or for a kind whose outage
    row holds retries): its kinds with a DONE are emptied, and its retries of the other kinds
    join their rows. (A DONE beside an empty row is not named, and its statement's retries of
    that kind count.) None when there is nothing to write, as for every statement while each
    provider answers."""
    noted = [(action_id, finish, kind) for action_id, finish, kind in written if kind]
    if not noted:
        return None
    done = {kind for _, finish, kind in noted if finish.state is ActionState.DONE}
    retries = sorted(
        (kind, action_id)
        for action_id, finish, kind in noted
        if finish.retried and kind not in done
    )
    if not done and not retries:
        return None
    # Imported here: the settings import this module (its threshold's ceiling), and a process
    # that reads a setting and nothing else (``outbox health``) loads no database driver.
    from outbox.binary_arrays import Int8Array, TextArray

    return {
        "resets": TextArray(sorted(done)),
        "kinds": TextArray([kind for kind, _ in retries]),
        "ids": Int8Array([action_id for _, action_id in retries]),
    }


def exhausts_on_retry(finish: Finish, action: Action) -> bool:
    """Whether ``finish`` ends an action whose last attempt answered ``Retry``, of an action
    that allows more than one (``max_attempts=1`` says: never try it again)."""
    return (
        finish.retried
        and finish.stop_reason == StopReason.ATTEMPTS_EXHAUSTED
        and action.max_attempts > 1
    )


def ride_out(finish: Finish, action: Action, settings: Settings) -> Finish:
    """The wait that replaces ``finish`` (an exhausting retry) while the provider is down: the
    attempt is given back and the action waits the backoff of its last attempt, as its last
    retry did."""
    after = backoff(action.attempt, settings.retry_base, settings.retry_cap)
    return replace(
        finish,
        state=ActionState.ADMITTED,
        stop_reason=None,
        after=after,
        gives_back_attempt=True,
    )
