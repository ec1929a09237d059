"""The chaos soak, short version (``benchmarks.chaos``), and proof that its checks catch what
they claim to.

The soak runs real claimer and dramatiq worker processes, a real SMTP sink process and a process
of HTTP providers (a webhook receiver, an issue tracker, a chat API) on a PostgreSQL and a Redis
of its own, SIGKILLs one process every few seconds, restarts the
broker and the database once each, takes the worker pool down for longer than a lease, and checks
every guarantee from PostgreSQL. The check tests below feed each check a violation it must
report, so a soak that passes says something.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from benchmarks.chaos import checks, servers
from benchmarks.chaos.checks import Evidence
from benchmarks.chaos.fleet import MAX_KILL_LEAD, Fleet, Member
from benchmarks.chaos.soak import Options, run
from tests.services import missing_service


@pytest.mark.slow
@pytest.mark.parametrize("fabric", ["dramatiq", "celery"])
def test_short_soak_under_sigkills_restarts_and_a_pool_outage_keeps_every_guarantee(
    fabric: str,
) -> None:
    missing = servers.missing_binaries()
    if missing:
        missing_service(missing)
    options = Options(
        actions=2500, duration=40.0, kill_interval=3.0, seed=3, erasures=4, fabric=fabric
    )
    outcome = run(options)
    print("\n" + outcome.table)
    failed = [c for c in outcome.checks if not c.ok]
    assert not failed, outcome.table
    assert len(outcome.checks) == 13
    assert all(c.examined > 0 for c in outcome.checks), outcome.table
    # The soak exercised what it claims to: kills of both roles, kills after a fence (an email's
    # among them, so UNCERTAIN is examined), retries from both injected provider faults,
    # erasures, expiries.
    happened = outcome.happened
    claimer_kills, worker_kills = map(int, happened["SIGKILLs (claimer / worker)"].split(" / "))
    assert claimer_kills + worker_kills >= 8 and worker_kills >= 2
    assert happened["  of them after the fence"] >= 1
    assert happened["  aimed at an email past its fence"] >= 1
    assert happened["email attempts retried (SMTP 4xx)"] > 0
    # Every HTTP fault was met (500 after the write, reset, slow answer, 429), and a webhook
    # was resent under its id after an answer was lost.
    faults = happened["HTTP faults planned/met: 500 after write / reset / slow / 429"]
    assert all(int(pair.split("/")[1]) > 0 for pair in faults.split(" / ")), faults
    assert happened["webhook resends of a taken webhook-id"] > 0
    assert int(happened["accounts erased / actions erased"].split(" / ")[1]) > 0
    assert happened["actions enqueued"] == 2500 and happened["lanes"] >= 300
    for fault in ("broker restart", "database restart", "worker pool outage"):
        assert f"fault: {fault}" in happened, outcome.table


@pytest.mark.parametrize("seed", range(50))
def test_kill_picks_never_let_one_role_lead_by_more_than_the_bound(seed: int) -> None:
    fleet = Fleet({}, ".", conn=None, watch="w")  # type: ignore[arg-type]
    roles = ("claimer", "claimer", "worker", "worker")
    fleet.members = [Member(role, proc=None) for role in roles]  # type: ignore[arg-type]
    rng = random.Random(seed)
    for _ in range(30):
        fleet.kills[fleet.pick(rng).role] += 1
        assert abs(fleet.kills["claimer"] - fleet.kills["worker"]) <= MAX_KILL_LEAD


# -- the checks catch violations -------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)
_ids = itertools.count(1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def enq(action_id: int, kind: str = "issue_comment", lane: str = "l1", account: str | None = None):
    keys = {"email": f"<{action_id}@x>", "webhook": f"msg_{action_id}"}
    return {
        "action_id": action_id,
        "kind": kind,
        "marker": f"m{action_id}",
        "lane": lane,
        "account": account,
        "expires": False,
        "effect_key": keys.get(kind, f"m{action_id}"),
        "fault": "",
    }


def action(action_id: int, state: str = "DONE", **extra: Any) -> dict[str, Any]:
    row = {
        "id": action_id,
        "kind": "ISSUE_COMMENT",
        "state": state,
        "stop_reason": state,
        "epoch": 1,
        "attempt": 1,
        "lane_key": "l1",
        "write_started_at": None,
        "earlier_write_at": None,
        "lease_until": at(100),
    }
    return {**row, **extra}


def attempt(action_id: int, start: float, stop: float | None, **extra: Any) -> dict[str, Any]:
    row = {
        "id": next(_ids),
        "action_id": action_id,
        "epoch": 1,
        "attempt": 1,
        "kind": "ISSUE_COMMENT",
        "lane": "l1",
        "pgid": 100,
        "pid": 101,
        "write_started": False,
        "started_at": at(start),
        "fence_asked_at": at(start),
        "fence_passed": True,
        "stopped_at": at(stop) if stop is not None else None,
        "result": "Done" if stop is not None else None,
    }
    return {**row, **extra}


def evidence(**fields: Any) -> Evidence:
    base: dict[str, Any] = {
        "enqueued": {1: enq(1), 2: enq(2)},
        "actions": {1: action(1), 2: action(2)},
        "attempts": [attempt(1, 0, 1), attempt(2, 2, 3)],
        "ends": [],
        "erasures": [],
        "issue_markers": Counter({"m1": 1, "m2": 1}),
        "accepted": Counter(),
        "expected_erased": {},
        "takes": Counter({1: 1, 2: 1}),
        "faults": [],
    }
    return Evidence(**{**base, **fields})


def test_a_clean_history_passes_every_check() -> None:
    results, _ = checks.run_all(evidence())
    assert all(c.ok for c in results), [c.violations for c in results]


def test_read_back_check_catches_a_duplicate_and_a_missing_comment() -> None:
    assert not checks.readback_once(evidence(issue_markers=Counter({"m1": 2, "m2": 1}))).ok
    assert not checks.readback_once(evidence(issue_markers=Counter({"m1": 1}))).ok


def test_read_back_check_catches_a_duplicate_and_a_missing_chat_reply() -> None:
    chats = {1: enq(1, "chat_reply"), 2: enq(2, "chat_reply")}
    assert checks.readback_once(evidence(enqueued=chats, chat_markers=Counter(m1=1, m2=1))).ok
    assert not checks.readback_once(evidence(enqueued=chats, chat_markers=Counter(m1=2, m2=1))).ok
    assert not checks.readback_once(evidence(enqueued=chats, chat_markers=Counter(m1=1))).ok


def test_read_back_check_allows_one_effect_only_after_a_write_began() -> None:
    # Expired while waiting for its retry after an ambiguous answer: the comment may exist.
    expired = action(1, "CANCELLED", stop_reason="EXPIRED", write_started_at=at(0.5))
    ev = evidence(actions={1: expired, 2: action(2)})
    assert checks.readback_once(ev).ok
    ev.issue_markers["m1"] = 2
    assert not checks.readback_once(ev).ok
    retried = action(1, "CANCELLED", stop_reason="EXPIRED", earlier_write_at=at(0.5))
    assert checks.readback_once(evidence(actions={1: retried, 2: action(2)})).ok
    never_written = evidence(actions={1: action(1, "CANCELLED"), 2: action(2)})
    assert not checks.readback_once(never_written).ok


def webhooks(**fields: Any) -> Evidence:
    enqueued = {1: enq(1, "webhook"), 2: enq(2, "webhook")}
    deliveries = {"m1": Counter({"msg_1": 1}), "m2": Counter({"msg_2": 1})}
    return evidence(**{"enqueued": enqueued, "deliveries": deliveries, **fields})


def test_webhook_check_counts_a_resend_of_one_id_and_catches_a_missing_or_second_delivery() -> None:
    assert checks.webhooks_once(webhooks()).ok
    resent = webhooks(deliveries={"m1": Counter({"msg_1": 3}), "m2": Counter({"msg_2": 1})})
    assert checks.webhooks_once(resent).ok
    missing = webhooks(deliveries={"m2": Counter({"msg_2": 1})})
    assert not checks.webhooks_once(missing).ok
    second = webhooks(deliveries={"m1": Counter({"msg_1": 1, "msg_9": 1}), "m2": Counter(msg_2=1)})
    assert not checks.webhooks_once(second).ok
    # Under another id only, even once: not its delivery.
    foreign = webhooks(deliveries={"m1": Counter({"msg_9": 1}), "m2": Counter({"msg_2": 1})})
    assert not checks.webhooks_once(foreign).ok
    failed = webhooks(actions={1: action(1, "FAILED"), 2: action(2)})
    assert not checks.webhooks_once(failed).ok


def test_signature_check_catches_one_bad_signature() -> None:
    assert checks.signatures_verified(webhooks()).ok
    assert not checks.signatures_verified(webhooks(bad_signatures=1)).ok


def test_read_back_kinds_end_uncertain_only_when_their_read_back_could_not_answer() -> None:
    unread = action(1, "UNCERTAIN", stop_reason="GITHUB_READBACK_HTTP_403")
    assert checks.readback_uncertain_only_unanswered(evidence(actions={1: unread, 2: action(2)})).ok
    # Its read-back's UNCERTAIN is not a kill's to explain.
    assert checks.uncertain_explained(evidence(actions={1: unread, 2: action(2)}))[0].ok
    cut = action(1, "UNCERTAIN", stop_reason="LEASE_EXPIRED_DURING_WRITE")
    assert not checks.readback_uncertain_only_unanswered(
        evidence(actions={1: cut, 2: action(2)})
    ).ok
    hook = webhooks(actions={1: action(1, "UNCERTAIN", stop_reason="X_READBACK_Y"), 2: action(2)})
    assert not checks.readback_uncertain_only_unanswered(hook).ok


def test_email_checks_catch_a_message_id_accepted_twice_and_a_stray_one() -> None:
    ev = evidence(
        enqueued={1: enq(1, "email"), 2: enq(2)},
        accepted=Counter({"<1@x>": 2}),
    )
    assert not checks.no_message_id_twice(ev).ok
    assert not checks.emails_once(ev).ok
    assert not checks.no_message_id_twice(evidence(accepted=Counter({"<9@x>": 1}))).ok


def test_an_uncertain_email_may_have_been_sent_once_but_a_failed_one_never() -> None:
    enqueued = {1: enq(1, "email"), 2: enq(2)}
    sent = Counter({"<1@x>": 1})
    uncertain = evidence(enqueued=enqueued, actions={1: action(1, "UNCERTAIN"), 2: action(2)})
    uncertain.accepted = sent
    assert checks.emails_once(uncertain).ok
    failed = evidence(enqueued=enqueued, actions={1: action(1, "FAILED"), 2: action(2)})
    failed.accepted = sent
    assert not checks.emails_once(failed).ok


def test_lane_check_catches_overlap_and_ends_a_killed_attempt_at_its_kill() -> None:
    overlap = evidence(attempts=[attempt(1, 0, 5), attempt(2, 2, 3)])
    assert not checks.no_lane_overlap(overlap).ok
    kill = {
        "id": 1,
        "pgid": 100,
        "role": "worker",
        "how": "SIGKILL",
        "before": at(1),
        "after": at(1.5),
    }
    killed = evidence(attempts=[attempt(1, 0, None), attempt(2, 2, 3, pgid=200)], ends=[kill])
    assert checks.no_lane_overlap(killed).ok
    never_ended = evidence(attempts=[attempt(1, 0, None), attempt(2, 2, 3, pgid=200)])
    assert not checks.no_lane_overlap(never_ended).ok
    # An attempt whose fence refused called no provider: it does not hold the lane.
    refused = evidence(attempts=[attempt(1, 0, 5, fence_passed=False), attempt(2, 2, 3)])
    assert checks.no_lane_overlap(refused).ok


def test_lane_check_excuses_an_overlap_only_where_the_holders_loop_stalled_across_its_cut() -> None:
    holder = attempt(1, 0, 5, deadline=at(1.5))  # cut due at 1.5, stopped at 5
    after = attempt(2, 2, 3)

    def stall(resumed: float, lag: float, pid: int = 101) -> dict[str, Any]:
        return {"id": 1, "pid": pid, "resumed_at": at(resumed), "lag": lag}

    across = checks.no_lane_overlap(evidence(attempts=[holder, after], stalls=[stall(4.9, 3.6)]))
    assert across.ok and len(across.excused) == 1, across
    for stalls in (
        [stall(4.9, 3.6, pid=999)],  # another process stalled
        [stall(1.6, 1.0)],  # its loop ran again before the next attempt began
        [stall(4.9, 2.0)],  # the stall began after the cut was due
        [],
    ):
        found = checks.no_lane_overlap(evidence(attempts=[holder, after], stalls=stalls))
        assert not found.ok and not found.excused, stalls
    # Without a recorded deadline nothing says when its cut was due.
    bare = attempt(1, 0, 5)
    assert not checks.no_lane_overlap(evidence(attempts=[bare, after], stalls=[stall(4.9, 4.9)])).ok


def test_lane_order_check_catches_a_later_action_running_first() -> None:
    assert not checks.lanes_in_id_order(evidence(attempts=[attempt(2, 0, 1), attempt(1, 2, 3)])).ok


def test_uncertain_check_names_the_kill_after_the_fence_and_rejects_any_other() -> None:
    actions = {1: action(1, "UNCERTAIN", write_started_at=at(0.5)), 2: action(2)}
    attempts = [attempt(1, 0, None), attempt(2, 8, 9, pgid=200)]
    kill = {
        "id": 7,
        "pgid": 100,
        "role": "worker",
        "how": "SIGKILL",
        "before": at(1),
        "after": at(1.1),
    }
    check, caused = checks.uncertain_explained(
        evidence(actions=actions, attempts=attempts, ends=[kill])
    )
    assert check.ok and caused == {1: 7}
    early = {**kill, "before": at(0.1), "after": at(0.2)}  # before the fence: not the cause
    assert not checks.uncertain_explained(
        evidence(actions=actions, attempts=attempts, ends=[early])
    )[0].ok
    stopped = {**kill, "how": "SIGTERM"}
    assert not checks.uncertain_explained(
        evidence(actions=actions, attempts=attempts, ends=[stopped])
    )[0].ok


def test_attempt_check_catches_an_attempt_spent_without_a_take_and_an_early_exhaustion() -> None:
    # A claim (or a reclaim after a lost push) that raised attempt: 2 attempts, 1 take.
    spent = evidence(actions={1: action(1, attempt=2), 2: action(2)})
    assert not checks.attempts_spent_by_runs(spent).ok
    # A take that did not raise attempt.
    assert not checks.attempts_spent_by_runs(evidence(takes=Counter({1: 2, 2: 1}))).ok
    # Exhausted after 1 adapter call of 3 (the other attempts spent while no worker ran).
    exhausted = action(1, "FAILED", stop_reason="ATTEMPTS_EXHAUSTED", attempt=3, max_attempts=3)
    early = evidence(actions={1: exhausted, 2: action(2)}, takes=Counter({1: 3, 2: 1}))
    check = checks.attempts_spent_by_runs(early)
    assert [v for v in check.violations if "ATTEMPTS_EXHAUSTED" in v], check.violations
    # Three takes, three adapter calls: a real exhaustion.
    early.attempts += [attempt(1, 1, 1.5), attempt(1, 1.6, 1.8)]
    assert checks.attempts_spent_by_runs(early).ok


def test_attempt_check_gives_a_written_deferral_its_attempt_back() -> None:
    deferred = evidence(
        attempts=[attempt(1, 0, 0.5, result="Defer"), attempt(1, 1, 1.5), attempt(2, 2, 3)],
        takes=Counter({1: 2, 2: 1}),
        recorded_defers=Counter({1: 1}),
    )
    assert checks.attempts_spent_by_runs(deferred).ok
    # The deferral's finish was lost (its worker killed after the adapter returned): the
    # attempt ran and is spent, so one attempt fewer than takes is a violation.
    lost = evidence(
        attempts=[attempt(1, 0, 0.5, result="Defer"), attempt(1, 1, 1.5), attempt(2, 2, 3)],
        takes=Counter({1: 2, 2: 1}),
    )
    assert not checks.attempts_spent_by_runs(lost).ok
    lost.actions[1]["attempt"] = 2
    assert checks.attempts_spent_by_runs(lost).ok


def test_uncertain_after_a_database_restart_is_explained_only_near_its_fence() -> None:
    actions = {1: action(1, "UNCERTAIN", write_started_at=at(0.5)), 2: action(2)}
    attempts = [attempt(1, 0, None), attempt(2, 8, 9, pgid=200)]
    restart = {"id": 1, "name": "database restart", "before": at(1), "after": at(3)}
    ev = evidence(actions=actions, attempts=attempts, faults=[restart])
    assert checks.uncertain_explained(ev)[0].ok
    late = {**restart, "before": at(200), "after": at(202)}  # after the lease ran out
    assert not checks.uncertain_explained(evidence(actions=actions, faults=[late]))[0].ok
    broker = {**restart, "name": "broker restart"}
    assert not checks.uncertain_explained(evidence(actions=actions, faults=[broker]))[0].ok


def test_lane_check_ends_an_attempt_whose_stop_was_not_written_at_its_deadline() -> None:
    unstopped = attempt(1, 0, None, deadline=at(1.5))  # its process lived on
    assert checks.no_lane_overlap(evidence(attempts=[unstopped, attempt(2, 2, 3)])).ok
    late = attempt(1, 0, None, deadline=at(2.5))
    assert not checks.no_lane_overlap(evidence(attempts=[late, attempt(2, 2, 3)])).ok


def test_erasure_checks_catch_a_lost_action_and_a_write_after_erasure() -> None:
    erasure = {"account": "a", "erased": 1, "in_flight": 0, "committed_at": at(1)}
    lost = evidence(actions={2: action(2)}, erasures=[], expected_erased={})
    assert not checks.nothing_lost(lost).ok
    assert not checks.every_action_ended(lost).ok
    erased = evidence(
        enqueued={1: enq(1, account="a"), 2: enq(2)},
        actions={2: action(2)},
        erasures=[erasure],
        expected_erased={"a": {1}},
        attempts=[attempt(1, 2, 2.5), attempt(2, 3, 4)],
    )
    assert checks.nothing_lost(erased).ok
    assert not checks.no_write_after_erasure(erased).ok
    erased.attempts = [attempt(1, 0.5, 2.5), attempt(2, 3, 4)]
    assert checks.no_write_after_erasure(erased).ok


@pytest.mark.parametrize("kind", ["email", "webhook", "issue_comment", "chat_reply"])
def test_erasure_check_catches_an_effect_of_any_kind_with_no_write_begun_before_it(
    kind: str,
) -> None:
    erasure = {"account": "a", "erased": 1, "in_flight": 0, "committed_at": at(1)}
    e = enq(1, kind, account="a")
    world = {
        "accepted": Counter({e["effect_key"]: 1}),
        "deliveries": {"m1": Counter({e["effect_key"]: 1})},
        "issue_markers": Counter({"m1": 1, "m2": 1}),
        "chat_markers": Counter({"m1": 1}),
    }
    # Its write began after the erasure (the fence answer was lost: it may have passed).
    late = evidence(
        enqueued={1: e, 2: enq(2)},
        actions={2: action(2)},
        erasures=[erasure],
        expected_erased={"a": {1}},
        attempts=[attempt(1, 2, 2.5, fence_passed=None), attempt(2, 3, 4)],
        **world,
    )
    check = checks.no_write_after_erasure(late)
    assert [v for v in check.violations if v.startswith(kind)], check.violations
    late.attempts = [attempt(1, 0.5, 2.5, fence_passed=None), attempt(2, 3, 4)]
    assert checks.no_write_after_erasure(late).ok


def test_every_action_ended_catches_an_action_left_waiting() -> None:
    assert not checks.every_action_ended(
        evidence(actions={1: action(1), 2: action(2, "ADMITTED")})
    ).ok
