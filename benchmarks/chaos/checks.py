"""The guarantees, checked from what PostgreSQL holds once the soak has ended.

Every check reads committed rows only: the outbox's ``agent_action``, the world (comments, the
Message-IDs the sink accepted) and the watch (attempts, takes, process ends, erasures, injected
faults, enqueued ids).
Each gives a count of what it examined and the violations it found; one violation fails the run.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from benchmarks.chaos.tables import Schemas

ENDED = ("DONE", "UNCERTAIN", "FAILED", "CANCELLED")
#: The names of the faults the harness injects (``<watch>.fault.name``).
BROKER_RESTART = "broker restart"
DATABASE_RESTART = "database restart"
WORKER_OUTAGE = "worker pool outage"
#: The end of an interval whose process end was never recorded (it counts as still running).
OPEN = datetime.max.replace(tzinfo=UTC)
#: How long after a database restart a pooled connection it broke may still fail a write: such a
#: connection fails on its next use, whenever that comes.
RESTART_AFTERMATH = timedelta(seconds=60)


@dataclass
class Check:
    name: str
    examined: int
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class Evidence:
    """Everything the checks read, loaded once."""

    enqueued: dict[int, dict[str, Any]]
    actions: dict[int, dict[str, Any]]
    attempts: list[dict[str, Any]]
    ends: list[dict[str, Any]]
    erasures: list[dict[str, Any]]
    comments: Counter[str]
    accepted: Counter[str]
    #: The ids each erasure was expected to delete (enqueued for that account before it).
    expected_erased: dict[str, set[int]]
    #: How many times a worker took each action (``<watch>.take``).
    takes: Counter[int] = field(default_factory=Counter)
    #: Injected faults besides the SIGKILLs (``<watch>.fault``): name, before, after.
    faults: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(
        cls, conn: psycopg.Connection[Any], s: Schemas, expected_erased: dict[str, set[int]]
    ) -> Evidence:
        cur = conn.cursor(row_factory=dict_row)

        def rows(query: str) -> list[dict[str, Any]]:
            return cur.execute(query).fetchall()

        w, o, t = f'"{s.watch}"', f'"{s.outbox}"', f'"{s.world}"'
        return cls(
            enqueued={r["action_id"]: r for r in rows(f"SELECT * FROM {w}.enqueued")},
            actions={
                r["id"]: r
                for r in rows(
                    "SELECT id, kind, state, stop_reason, epoch, attempt, max_attempts, lane_key,"
                    f" write_started_at, lease_until FROM {o}.agent_action"
                )
            },
            attempts=rows(f"SELECT * FROM {w}.attempt ORDER BY started_at, id"),
            ends=rows(f"SELECT * FROM {w}.process_end ORDER BY id"),
            erasures=rows(f"SELECT * FROM {w}.erasure ORDER BY committed_at"),
            comments=Counter(r["marker"] for r in rows(f"SELECT marker FROM {t}.comment")),
            accepted=Counter(
                r["message_id"] for r in rows(f"SELECT message_id FROM {t}.smtp_accepted")
            ),
            expected_erased=expected_erased,
            takes=Counter(r["action_id"] for r in rows(f"SELECT action_id FROM {w}.take")),
            faults=rows(f"SELECT * FROM {w}.fault ORDER BY id"),
        )

    @property
    def erased_ids(self) -> set[int]:
        return set().union(*self.expected_erased.values()) if self.expected_erased else set()

    def effects(self, action_id: int) -> int:
        """How often the action's effect exists in the world (comments, or accepted emails)."""
        e = self.enqueued[action_id]
        if e["kind"] == "email":
            return self.accepted[e["message_id"]]
        return self.comments[e["marker"]]

    def interval_end(self, attempt: dict[str, Any]) -> datetime:
        """When an attempt stopped: its own stop, else its process group's end or its deadline,
        whichever came first: the executor cancels an attempt at its lease's end, and a stop
        that met the database down (a restart) was never written."""
        if attempt["stopped_at"] is not None:
            return attempt["stopped_at"]
        return min(self.process_end(attempt["pgid"]) or OPEN, attempt.get("deadline") or OPEN)

    def process_end(self, pgid: int) -> datetime | None:
        ends = [e["after"] for e in self.ends if e["pgid"] == pgid]
        return min(ends) if ends else None


def _sample(items: Iterable[str], n: int = 5) -> list[str]:
    return list(itertools.islice(items, n))


def every_action_ended(ev: Evidence) -> Check:
    check = Check("every action ended", len(ev.enqueued) - len(ev.erased_ids))
    for action_id in sorted(ev.enqueued):
        row = ev.actions.get(action_id)
        if row is None and action_id not in ev.erased_ids:
            check.violations.append(f"action {action_id} vanished without an erasure")
        elif row is not None and row["state"] not in ENDED:
            check.violations.append(f"action {action_id} still {row['state']}")
    return check


def nothing_lost(ev: Evidence) -> Check:
    """enqueued = ended + erased, and the erased are exactly those the erasures named."""
    ended = sum(1 for a in ev.actions.values() if a["state"] in ENDED)
    reported = sum(e["erased"] for e in ev.erasures)
    check = Check("enqueued = ended + erased", len(ev.enqueued))
    if len(ev.enqueued) != ended + reported:
        check.violations.append(f"{len(ev.enqueued)} enqueued != {ended} ended + {reported} erased")
    gone = set(ev.enqueued) - set(ev.actions)
    if gone != ev.erased_ids:
        check.violations.append(
            f"gone {len(gone)} != erased {len(ev.erased_ids)}: {sorted(gone ^ ev.erased_ids)[:5]}"
        )
    strangers = set(ev.actions) - set(ev.enqueued)
    if strangers:
        check.violations.append(f"{len(strangers)} actions nobody enqueued")
    return check


def no_message_id_twice(ev: Evidence) -> Check:
    check = Check("no Message-ID accepted twice", sum(ev.accepted.values()))
    check.violations = _sample(f"{mid} accepted {n}x" for mid, n in ev.accepted.items() if n > 1)
    known = {e["message_id"] for e in ev.enqueued.values() if e["kind"] == "email"}
    check.violations += _sample(
        f"{mid} belongs to no action" for mid in ev.accepted if mid not in known
    )
    return check


def _effects_by_state(ev: Evidence, kind: str, name: str) -> Check:
    """DONE: exactly once; UNCERTAIN or erased: at most once; FAILED, CANCELLED: never."""
    ids = [i for i, e in ev.enqueued.items() if e["kind"] == kind]
    check = Check(name, len(ids))
    for action_id in ids:
        n = ev.effects(action_id)
        row = ev.actions.get(action_id)
        state = row["state"] if row else "ERASED"
        allowed = {"DONE": (1,), "UNCERTAIN": (0, 1), "ERASED": (0, 1)}.get(state, (0,))
        if n not in allowed:
            check.violations.append(f"{kind} action {action_id} {state} has {n} effects")
    return check


def emails_once(ev: Evidence) -> Check:
    return _effects_by_state(ev, "email", "email: DONE sent once, others at most once")


def comments_once(ev: Evidence) -> Check:
    return _effects_by_state(ev, "comment", "read-back: DONE present exactly once")


def _lane_attempts(ev: Evidence) -> dict[str, list[dict[str, Any]]]:
    """Per lane, the attempts that may have acted, by start: all but those whose fence refused
    (they called no provider: another holder, or an erasure, owned the action)."""
    lanes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for attempt in ev.attempts:
        if attempt["fence_passed"] is not False:
            lanes[attempt["lane"]].append(attempt)
    return lanes


def no_lane_overlap(ev: Evidence) -> Check:
    lanes = _lane_attempts(ev)
    check = Check("no lane overlap (attempt intervals)", sum(len(v) for v in lanes.values()))
    for lane, attempts in lanes.items():
        holder: dict[str, Any] | None = None
        for attempt in attempts:
            if holder is not None and attempt["started_at"] < ev.interval_end(holder):
                check.violations.append(
                    f"lane {lane}: action {attempt['action_id']} epoch {attempt['epoch']} "
                    f"started {attempt['started_at']} before action {holder['action_id']} epoch "
                    f"{holder['epoch']} stopped {ev.interval_end(holder)}"
                )
            if holder is None or ev.interval_end(attempt) > ev.interval_end(holder):
                holder = attempt
    return check


def lanes_in_id_order(ev: Evidence) -> Check:
    lanes = _lane_attempts(ev)
    check = Check("lanes ran in id order", len(lanes))
    for lane, attempts in lanes.items():
        ids = [a["action_id"] for a in attempts]
        if any(b < a for a, b in itertools.pairwise(ids)):
            check.violations.append(f"lane {lane} ran {ids[:10]}")
    return check


def restart_explains(ev: Evidence, action: dict[str, Any]) -> bool:
    """A database restart came before the action's lease ran out, and after its fence at most by
    RESTART_AFTERMATH: the attempt's finish may have met the database down, or a connection the
    restart broke, so its result was never written."""
    fenced = action["write_started_at"]
    return fenced is not None and any(
        f["name"] == DATABASE_RESTART
        and f["before"] <= action["lease_until"]
        and fenced <= f["after"] + RESTART_AFTERMATH
        for f in ev.faults
    )


def uncertain_explained(ev: Evidence) -> tuple[Check, dict[int, int]]:
    """Each UNCERTAIN action has an attempt of its last epoch that asked its fence and whose
    process group was SIGKILLed after the fence passed and before the lease ran out, so that
    attempt's finish was never written (the adapter itself may have returned already: a kill
    between its return and the executor's fenced finish loses the result, too), or else a
    database restart explains it (``restart_explains``). Returns the check and which kill
    (``process_end.id``) caused each UNCERTAIN a kill caused."""
    uncertain = [a for a in ev.actions.values() if a["state"] == "UNCERTAIN"]
    check = Check("every UNCERTAIN caused by a kill or a restart", len(uncertain))
    caused: dict[int, int] = {}
    kills = [e for e in ev.ends if e["how"] == "SIGKILL"]
    for action in uncertain:
        fenced = action["write_started_at"]
        culprit = None
        for attempt in ev.attempts:
            if (
                attempt["action_id"] != action["id"]
                or attempt["epoch"] != action["epoch"]
                or attempt["fence_asked_at"] is None
                or fenced is None
            ):
                continue
            culprit = next(
                (
                    k
                    for k in kills
                    if k["pgid"] == attempt["pgid"]
                    and k["after"] >= fenced
                    and k["before"] <= action["lease_until"]
                ),
                None,
            )
            if culprit is not None:
                break
        if culprit is not None:
            caused[action["id"]] = culprit["id"]
        elif not restart_explains(ev, action):
            check.violations.append(
                f"action {action['id']} UNCERTAIN {action['stop_reason']} with no kill after "
                "its fence nor a database restart"
            )
    return check, caused


def attempts_spent_by_runs(ev: Evidence) -> Check:
    """An action's ``attempt`` is the number of times a worker took it (claims, reclaims and
    lost pushes spend none), and no action ends ATTEMPTS_EXHAUSTED having called its adapter
    fewer than ``max_attempts`` times."""
    check = Check("attempts are spent only by runs", len(ev.actions))
    calls = Counter(a["action_id"] for a in ev.attempts)
    for action_id, action in sorted(ev.actions.items()):
        taken = ev.takes[action_id]
        if action["attempt"] != taken:
            check.violations.append(
                f"action {action_id} {action['state']} at attempt {action['attempt']}, "
                f"taken {taken}x"
            )
        if action["stop_reason"] == "ATTEMPTS_EXHAUSTED" and calls[action_id] < action.get(
            "max_attempts", 0
        ):
            check.violations.append(
                f"action {action_id} ATTEMPTS_EXHAUSTED after {calls[action_id]} adapter calls "
                f"of {action['max_attempts']}"
            )
    return check


def no_write_after_erasure(ev: Evidence) -> Check:
    """No attempt of an erased action passed a fence it asked after the erasure committed."""
    committed = {e["account"]: e["committed_at"] for e in ev.erasures}
    account_of = {i: acc for acc, ids in ev.expected_erased.items() for i in ids}
    attempts = [a for a in ev.attempts if a["action_id"] in account_of]
    check = Check("no write began after its erasure", len(attempts))
    for a in attempts:
        if (
            a["fence_passed"]
            and a["fence_asked_at"] is not None
            and a["fence_asked_at"] > committed[account_of[a["action_id"]]]
        ):
            check.violations.append(f"action {a['action_id']} wrote after its subject was erased")
    return check


def run_all(ev: Evidence) -> tuple[list[Check], dict[int, int]]:
    uncertain, caused = uncertain_explained(ev)
    checks = [
        every_action_ended(ev),
        nothing_lost(ev),
        no_message_id_twice(ev),
        emails_once(ev),
        comments_once(ev),
        no_lane_overlap(ev),
        lanes_in_id_order(ev),
        uncertain,
        no_write_after_erasure(ev),
        attempts_spent_by_runs(ev),
    ]
    return checks, caused
