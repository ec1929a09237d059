"""What holds the database's vacuum horizon back: sessions with a long-open snapshot or
transaction, prepared transactions, replication slots and replicas that report their oldest
snapshot (``hot_standby_feedback``) (``vacuum_horizon_holders`` in ``queries.sql``).

While one is open, vacuum can remove none of the dead row versions the outbox leaves (a lane row
an action, the action's earlier versions), and every claim steps over all of them in the lane
index, so claims slow down the longer it stays open (``horizon`` in the benchmarks). ``outbox
status`` lists what has held it for over ``HELD_TOO_LONG`` (a slot or a replica, which carry no
time, once they hold it ``HELD_TOO_MANY_XIDS`` transactions back, and an inactive slot at once);
the claimer's housekeeping sets ``outbox_vacuum_horizon_held_seconds`` to the longest hold and
``outbox_vacuum_horizon_held_xids`` to the most transactions any holder holds it back.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from outbox._io import Operation, Statement
from outbox.durations import say_duration
from outbox.queries import queries_for

#: How long a hold ``outbox status`` lets pass before it lists the holder: a busy outbox runs
#: tens of thousands of actions in that time, and each claim meets all their dead lane rows.
HELD_TOO_LONG = timedelta(minutes=1)
#: How far back a replication slot or a replica (whose hold has no start time) must hold the
#: horizon, in transactions, before ``outbox status`` lists it: a healthy replica's feedback
#: trails the primary by its oldest query and its reporting interval, which at a few thousand
#: transactions a second is tens of thousands of transactions.
HELD_TOO_MANY_XIDS = 100_000
#: How many holders a reading lists, the longest first.
LISTED = 5


def horizon_holders_operation(
    schema: str,
    older_than: timedelta = HELD_TOO_LONG,
    limit: int | None = LISTED,
    older_than_xids: int = HELD_TOO_MANY_XIDS,
) -> Operation[list[dict[str, Any]]]:
    """Each holder (holder, pid, role, name, state, held_s, xid_age) that has held the horizon
    for more than ``older_than`` (a slot or a replica: ``older_than_xids`` transactions back, or
    an inactive slot), the longest first, then the slots and replicas by ``xid_age``; ``limit``
    None lists them all."""
    rows = yield Statement(
        queries_for(schema)["vacuum_horizon_holders"],
        {
            "older_than": older_than.total_seconds(),
            "older_than_xids": older_than_xids,
            "limit": limit,
        },
    )
    return [dict(row) for row in rows]


def listing_rule() -> str:
    """What gets a holder listed, in words: ``outbox status`` and the console say it alike."""
    return (
        f"over {say_duration(HELD_TOO_LONG.total_seconds())} (a replication slot or a replica: "
        f"{HELD_TOO_MANY_XIDS:,} transactions back, or a slot no replica reads)"
    )


def describe_holder(holder: dict[str, Any]) -> str:
    """One holder in words: what it is, whose, and for how long."""
    if holder["holder"] == "session":
        what = f"session pid {holder['pid']} (role {holder['role']}"
        what += f", {holder['name']!r}" if holder["name"] else ""
        what += f", {holder['state']})" if holder["state"] else ")"
        return f"{what} open for {say_duration(holder['held_s'])}"
    if holder["holder"] == "prepared transaction":
        return (
            f"prepared transaction {holder['name']!r} (role {holder['role']}) prepared "
            f"{say_duration(holder['held_s'])} ago"
        )
    back = f"{holder['xid_age']:,} transactions back"
    if holder["holder"] == "replication slot":
        if holder["state"] == "inactive":
            return f"replication slot {holder['name']!r} (inactive: no replica reads it) {back}"
        return f"replication slot {holder['name']!r} (read by pid {holder['pid']}) {back}"
    name = f"{holder['name']!r}, " if holder["name"] else ""
    return f"replica {name}pid {holder['pid']} (role {holder['role']}, hot_standby_feedback) {back}"
