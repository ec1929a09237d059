"""What holds the database's vacuum horizon back: sessions with a long-open snapshot or
transaction, and prepared transactions (``vacuum_horizon_holders`` in ``queries.sql``).

While one is open, vacuum can remove none of the dead row versions the outbox leaves (a lane row
an action, the action's earlier versions), and every claim steps over all of them in the lane
index, so claims slow down the longer it stays open (``horizon`` in the benchmarks). ``outbox
status`` lists what has held it for over ``HELD_TOO_LONG``; the claimer's housekeeping sets
``outbox_vacuum_horizon_held_seconds`` to the longest hold.
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
#: How many holders a reading lists, the longest first.
LISTED = 5


def horizon_holders_operation(
    schema: str, older_than: timedelta = HELD_TOO_LONG, limit: int = LISTED
) -> Operation[list[dict[str, Any]]]:
    """Each holder (holder, pid, role, name, state, held_s) that has held the horizon for more
    than ``older_than``, the longest first."""
    rows = yield Statement(
        queries_for(schema)["vacuum_horizon_holders"],
        {"older_than": older_than.total_seconds(), "limit": limit},
    )
    return [dict(row) for row in rows]


def describe_holder(holder: dict[str, Any]) -> str:
    """One holder in words: what it is, whose, and for how long."""
    if holder["holder"] == "session":
        what = f"session pid {holder['pid']} (role {holder['role']}"
        what += f", {holder['name']!r}" if holder["name"] else ""
        what += f", {holder['state']})" if holder["state"] else ")"
        return f"{what} open for {say_duration(holder['held_s'])}"
    return (
        f"prepared transaction {holder['name']!r} (role {holder['role']}) prepared "
        f"{say_duration(holder['held_s'])} ago"
    )
