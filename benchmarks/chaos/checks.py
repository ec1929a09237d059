"""The guarantees, checked from what PostgreSQL holds once the soak has ended.

Every check reads committed rows only: the outbox's ``agent_action``, the world (the Message-IDs
the sink accepted; the webhook deliveries, issue comments and chat messages the HTTP providers
took) and the watch (attempts, takes, process ends, erasures, injected
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
#: How long before a recorded stall its loop may already have been stalled: the sampler's period
#: (``recording.STALL_SAMPLE``), rounded up.
STALL_ONSET = timedelta(seconds=0.1)
#: The read-back kinds the soak runs (``<watch>.enqueued.kind``), and those whose effect is found
#: by a marker (the webhook's is found by its webhook-id at the receiver).
READ_BACK = ("webhook", "issue_comment", "chat_reply")
MARKED = ("issue_comment", "chat_reply")
#: What a read-back kind's stop reason holds when its read-back could not answer.
READBACK_REASON = "_READBACK_"


@dataclass
class Check:
    name: str
    examined: int
    violations: list[str] = field(default_factory=list)
    #: What would have been a violation but for a cause the harness measured (the report lists
    #: them, so a run that leans on them shows it).
    excused: list[str] = field(default_factory=list)

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
    accepted: Counter[str]
    #: The ids each erasure was expected to delete (enqueued for that account before it).
    expected_erased: dict[str, set[int]]
    #: How many times a worker took each action (``<watch>.take``).
    takes: Counter[int] = field(default_factory=Counter)
    #: How many attempts of each action the outbox gave back (its attempt history's ``DEFER``
    #: rows, and the ``RETRY`` rows a provider outage gave back: a later attempt carries the
    #: same number): an adapter's Defer whose finish a kill or a restart lost gave nothing back.
    recorded_defers: Counter[int] = field(default_factory=Counter)
    #: Injected faults besides the SIGKILLs (``<watch>.fault``): name, before, after.
    faults: list[dict[str, Any]] = field(default_factory=list)
    #: Per webhook event (``<key>@<slot>``), how often the receiver took each webhook-id.
    deliveries: dict[str, Counter[str]] = field(default_factory=dict)
    #: Requests the webhook receiver refused for their signature.
    bad_signatures: int = 0
    #: How many comments / chat messages carry each marker.
    issue_markers: Counter[str] = field(default_factory=Counter)
    chat_markers: Counter[str] = field(default_factory=Counter)
    #: The HTTP providers' faults met, per fault (``receivers``).
    http_faults: Counter[str] = field(default_factory=Counter)
    #: When a process's loop ran a timer late (``<watch>.stall``): pid, resumed_at, lag.
    stalls: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(
        cls, conn: psycopg.Connection[Any], s: Schemas, expected_erased: dict[str, set[int]]
    ) -> Evidence:
        cur = conn.cursor(row_factory=dict_row)

        def rows(query: str) -> list[dict[str, Any]]:
            return cur.execute(query).fetchall()

        w, o, t = f'"{s.watch}"', f'"{s.outbox}"', f'"{s.world}"'
        deliveries: dict[str, Counter[str]] = defaultdict(Counter)
        for r in rows(f"SELECT event, webhook_id FROM {t}.webhook_delivery"):
            deliveries[r["event"]][r["webhook_id"]] += 1
        bad = rows(f"SELECT count(*) AS n FROM {t}.webhook_bad_signature")[0]["n"]
        return cls(
            enqueued={r["action_id"]: r for r in rows(f"SELECT * FROM {w}.enqueued")},
            actions={
                r["id"]: r
                for r in rows(
                    "SELECT id, kind, state, stop_reason, epoch, attempt, max_attempts, lane_key,"
                    f" write_started_at, earlier_write_at, lease_until FROM {o}.agent_action"
                )
            },
            attempts=rows(f"SELECT * FROM {w}.attempt ORDER BY started_at, id"),
            ends=rows(f"SELECT * FROM {w}.process_end ORDER BY id"),
            erasures=rows(f"SELECT * FROM {w}.erasure ORDER BY committed_at"),
            accepted=Counter(
                r["message_id"] for r in rows(f"SELECT message_id FROM {t}.smtp_accepted")
            ),
            expected_erased=expected_erased,
            takes=Counter(r["action_id"] for r in rows(f"SELECT action_id FROM {w}.take")),
            recorded_defers=Counter(
                r["action_id"]
                for r in rows(
                    f"SELECT h.action_id FROM {o}.agent_action_attempt h"
                    " WHERE h.result = 'DEFER' OR (h.result = 'RETRY' AND EXISTS ("
                    f"SELECT 1 FROM {o}.agent_action_attempt n WHERE n.action_id = h.action_id"
                    " AND n.epoch > h.epoch AND n.attempt = h.attempt))"
                )
            ),
            faults=rows(f"SELECT * FROM {w}.fault ORDER BY id"),
            deliveries=dict(deliveries),
            bad_signatures=int(bad),
            issue_markers=Counter(
                r["marker"] for r in rows(f"SELECT marker FROM {t}.issue_comment")
            ),
            chat_markers=Counter(r["marker"] for r in rows(f"SELECT marker FROM {t}.chat_message")),
            http_faults=Counter(r["fault"] for r in rows(f"SELECT fault FROM {t}.http_fault_met")),
            stalls=rows(f"SELECT * FROM {w}.stall ORDER BY resumed_at"),
        )

    @property
    def erased_ids(self) -> set[int]:
        return set().union(*self.expected_erased.values()) if self.expected_erased else set()

    def effects(self, action_id: int) -> int:
        """How often the action's effect exists in the world: its Message-ID accepted, its
        marker on an issue or in a channel, or the distinct webhook-ids its event was delivered
        under at its endpoint (resends of one id are one effect)."""
        e = self.enqueued[action_id]
        kind = e["kind"]
        if kind == "email":
            return self.accepted[e["effect_key"]]
        if kind == "webhook":
            return len(self.deliveries.get(e["marker"], ()))
        if kind == "issue_comment":
            return self.issue_markers[e["effect_key"]]
        if kind == "chat_reply":
            return self.chat_markers[e["effect_key"]]
        raise ValueError(f"action {action_id}: unknown kind {kind!r}")

    def interval_end(self, attempt: dict[str, Any]) -> datetime:
        """When an attempt stopped: its own stop, else its process group's end or its deadline,
        whichever came first: the executor cancels an attempt at its lease's end, and a stop
        that met the database down (a restart) was never written."""
        if attempt["stopped_at"] is not None:
            return attempt["stopped_at"]
        return min(self.process_end(attempt["pgid"]) or OPEN, attempt.get("deadline") or OPEN)

    def stalled_past(self, attempt: dict[str, Any], moment: datetime) -> dict[str, Any] | None:
        """A stall of the attempt's process that held its loop from before the attempt's cut
        was due until ``moment`` or later: its cut, a loop timer, could not run before then."""
        deadline = attempt.get("deadline")
        if deadline is None:
            return None
        for stall in self.stalls:
            # The loop resumed with the next attempt already started (within a sample: the
            # cut ran in the same turn of the loop as the sampler, the stop a moment later).
            if stall["pid"] != attempt["pid"] or stall["resumed_at"] < moment - STALL_ONSET:
                continue
            began = stall["resumed_at"] - timedelta(seconds=stall["lag"]) - STALL_ONSET
            if began <= deadline:
                return stall
        return None

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
    known = {e["effect_key"] for e in ev.enqueued.values() if e["kind"] == "email"}
    check.violations += _sample(
        f"{mid} belongs to no action" for mid in ev.accepted if mid not in known
    )
    return check


def ended_after_a_write(action: dict[str, Any] | None) -> bool:
    """A read-back action that ended FAILED or CANCELLED after one of its attempts passed its
    fence (a retry after an ambiguous answer, which keeps that as ``earlier_write_at``, that
    then expired or ran out of attempts): its effect may exist once."""
    return (
        action is not None
        and action["state"] in ("FAILED", "CANCELLED")
        and (action["write_started_at"] or action.get("earlier_write_at")) is not None
    )


def _effects_by_state(ev: Evidence, kinds: tuple[str, ...], name: str) -> Check:
    """DONE: exactly once; UNCERTAIN or erased: at most once; FAILED, CANCELLED: never (a
    read-back kind's after a write began: at most once)."""
    ids = [i for i, e in ev.enqueued.items() if e["kind"] in kinds]
    check = Check(name, len(ids))
    for action_id in ids:
        n = ev.effects(action_id)
        row = ev.actions.get(action_id)
        state = row["state"] if row else "ERASED"
        allowed = {"DONE": (1,), "UNCERTAIN": (0, 1), "ERASED": (0, 1)}.get(state, (0,))
        if ev.enqueued[action_id]["kind"] != "email" and ended_after_a_write(row):
            allowed = (0, 1)
        if n not in allowed:
            kind = ev.enqueued[action_id]["kind"]
            check.violations.append(f"{kind} action {action_id} {state} has {n} effects")
    return check


def emails_once(ev: Evidence) -> Check:
    return _effects_by_state(ev, ("email",), "email: DONE sent once, others at most once")


def readback_once(ev: Evidence) -> Check:
    """Issue comments and chat replies: present exactly once by marker when DONE."""
    return _effects_by_state(ev, MARKED, "issue comment, chat reply: DONE present once by marker")


def webhooks_once(ev: Evidence) -> Check:
    """Each webhook action's event reached its endpoint under its own webhook-id only: once at
    least when DONE (a resend of that id is counted, not a violation), never under another id
    (a second distinct delivery), and the same rules as the other kinds otherwise."""
    check = _effects_by_state(ev, ("webhook",), "webhook: DONE taken once by webhook-id")
    for action_id, e in ev.enqueued.items():
        if e["kind"] != "webhook":
            continue
        others = set(ev.deliveries.get(e["marker"], ())) - {e["effect_key"]}
        if others:
            check.violations.append(
                f"webhook action {action_id} delivered under other ids {sorted(others)[:3]}"
            )
    return check


def signatures_verified(ev: Evidence) -> Check:
    """The receiver verified every delivery (Standard Webhooks, the subscription's secret)."""
    taken = sum(sum(ids.values()) for ids in ev.deliveries.values())
    check = Check("webhook: no bad signature", taken + ev.bad_signatures)
    if ev.bad_signatures:
        check.violations.append(f"{ev.bad_signatures} deliveries with a bad signature")
    return check


def readback_uncertain_only_unanswered(ev: Evidence) -> Check:
    """A read-back kind ends UNCERTAIN only when its read-back could not answer, and its reason
    says so; a webhook never (its receiver dedupes, so a resend is always safe)."""
    ids = [i for i, e in ev.enqueued.items() if e["kind"] in READ_BACK]
    check = Check("read-back kinds: UNCERTAIN only when unread", len(ids))
    for action_id in ids:
        row = ev.actions.get(action_id)
        if row is None or row["state"] != "UNCERTAIN":
            continue
        kind = ev.enqueued[action_id]["kind"]
        if kind == "webhook" or READBACK_REASON not in (row["stop_reason"] or ""):
            check.violations.append(f"{kind} action {action_id} UNCERTAIN {row['stop_reason']}")
    return check


def _lane_attempts(ev: Evidence) -> dict[str, list[dict[str, Any]]]:
    """Per lane, the attempts that may have acted, by start: all but those whose fence refused
    (they called no provider: another holder, or an erasure, owned the action)."""
    lanes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for attempt in ev.attempts:
        if attempt["fence_passed"] is not False:
            lanes[attempt["lane"]].append(attempt)
    return lanes


def _how(attempt: dict[str, Any]) -> str:
    """What the record says of an attempt that overlapped the next: how it ended, its fence's
    answer, its deadline and its process, for the one reading the failure."""
    return (
        f"ended {attempt.get('result') or 'unrecorded'}, fence passed "
        f"{attempt.get('fence_passed')}, deadline {attempt.get('deadline')}, "
        f"pid {attempt.get('pid')}"
    )


def no_lane_overlap(ev: Evidence) -> Check:
    lanes = _lane_attempts(ev)
    check = Check("no lane overlap (attempt intervals)", sum(len(v) for v in lanes.values()))
    for lane, attempts in lanes.items():
        holder: dict[str, Any] | None = None
        for attempt in attempts:
            if holder is not None and attempt["started_at"] < ev.interval_end(holder):
                overlap = (
                    f"lane {lane}: action {attempt['action_id']} epoch {attempt['epoch']} "
                    f"started {attempt['started_at']} before action {holder['action_id']} epoch "
                    f"{holder['epoch']} stopped {ev.interval_end(holder)} ({_how(holder)})"
                )
                stall = ev.stalled_past(holder, attempt["started_at"])
                if stall is None:
                    check.violations.append(overlap)
                else:
                    # The holder was cut late because its process did not run: the outbox's
                    # cut is on time only where its loop is (the fences stay exact).
                    check.excused.append(
                        f"{overlap}: its loop stalled {stall['lag']:.2f} s to {stall['resumed_at']}"
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
    restart broke, and been sent again until its lease ran out (``outbox.outage``: the soak's
    leases are seconds), so its result was never written."""
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
    database restart explains it (``restart_explains``). An UNCERTAIN whose read-back could not
    answer is ``readback_uncertain_only_unanswered``'s. Returns the check and which kill
    (``process_end.id``) caused each UNCERTAIN a kill caused."""
    uncertain = [
        a
        for a in ev.actions.values()
        if a["state"] == "UNCERTAIN" and READBACK_REASON not in (a["stop_reason"] or "")
    ]
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
    """An action's ``attempt`` is the number of times a worker took it less its deferrals the
    outbox wrote (a rate limit gives its attempt back; claims, reclaims and lost pushes spend
    none; an adapter's Defer whose finish a kill or a restart lost ran, and spent its attempt;
    a slot too far away defers before the adapter runs), and no action ends ATTEMPTS_EXHAUSTED
    having called its adapter fewer than ``max_attempts`` times."""
    check = Check("attempts are spent only by runs", len(ev.actions))
    calls = Counter(a["action_id"] for a in ev.attempts)
    deferred = Counter(a["action_id"] for a in ev.attempts if a["result"] == "Defer")
    for action_id, action in sorted(ev.actions.items()):
        taken = ev.takes[action_id] - ev.recorded_defers[action_id]
        if action["attempt"] != taken:
            check.violations.append(
                f"action {action_id} {action['state']} at attempt {action['attempt']}, "
                f"taken {ev.takes[action_id]}x, deferrals written "
                f"{ev.recorded_defers[action_id]}x, returned by its adapter "
                f"{deferred[action_id]}x"
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
    """For an erased action of any kind: no attempt passed a fence it asked after the erasure
    committed, and an effect of it in the world (a Message-ID, a webhook-id, a marker) has an
    attempt that may have passed its fence before the erasure committed: its write began
    before the erasure, or it is a write nobody recorded."""
    committed = {e["account"]: e["committed_at"] for e in ev.erasures}
    account_of = {i: acc for acc, ids in ev.expected_erased.items() for i in ids}
    attempts = [a for a in ev.attempts if a["action_id"] in account_of]
    check = Check("no write began after its erasure", len(account_of))
    began_before: set[int] = set()
    for a in attempts:
        erased_at = committed[account_of[a["action_id"]]]
        if a["fence_asked_at"] is None or a["fence_passed"] is False:
            continue
        if a["fence_asked_at"] > erased_at:
            if a["fence_passed"]:
                kind = ev.enqueued[a["action_id"]]["kind"]
                check.violations.append(
                    f"{kind} action {a['action_id']} wrote after its subject was erased"
                )
        else:
            began_before.add(a["action_id"])
    for action_id in sorted(account_of):
        if action_id in ev.enqueued and action_id not in began_before and ev.effects(action_id):
            kind = ev.enqueued[action_id]["kind"]
            check.violations.append(
                f"{kind} action {action_id} has an effect but no write begun before its erasure"
            )
    return check


def run_all(ev: Evidence) -> tuple[list[Check], dict[int, int]]:
    uncertain, caused = uncertain_explained(ev)
    checks = [
        every_action_ended(ev),
        nothing_lost(ev),
        no_message_id_twice(ev),
        emails_once(ev),
        webhooks_once(ev),
        signatures_verified(ev),
        readback_once(ev),
        readback_uncertain_only_unanswered(ev),
        no_lane_overlap(ev),
        lanes_in_id_order(ev),
        uncertain,
        no_write_after_erasure(ev),
        attempts_spent_by_runs(ev),
    ]
    return checks, caused
