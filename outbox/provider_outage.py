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

The provider is still called, once an action a backoff (at the defaults 40 to 80 s), so the
first call after it is back succeeds and the outage ends by itself. An operator who knows the
provider is down for long pauses the kind instead (``outbox pause``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import replace
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
#: ``Settings.outage_threshold`` and ``Settings.outage_limit`` unless configured.
DEFAULT_THRESHOLD = 5
DEFAULT_LIMIT = timedelta(hours=24)


class OutageVerdict(enum.Enum):
    """What a kind's outage row says of its provider, under a threshold and a limit."""

    #: Fewer distinct actions retried than the threshold (or the threshold is 0, off): their
    #: attempts count as without an outage.
    RETRYING = "retrying"
    #: Down: an exhausting attempt gives its attempt back.
    DOWN = "down"
    #: Down for longer than the limit: attempts count again.
    PAST_LIMIT = "past_limit"


def outage_verdict(
    actions: int, retrying_for: float, threshold: int, limit: timedelta
) -> OutageVerdict:
    """The one rule of "counts as down", for the executor (``Store.provider_down``), ``outbox
    status`` and the console alike: ``actions`` distinct actions of a kind retried since its last
    DONE, the first ``retrying_for`` seconds ago (both read off the database and its clock)."""
    if not 0 < threshold <= actions:
        return OutageVerdict.RETRYING
    if retrying_for < limit.total_seconds():
        return OutageVerdict.DOWN
    return OutageVerdict.PAST_LIMIT


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
