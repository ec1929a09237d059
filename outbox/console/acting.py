"""The console's operator actions: every one a POST with the session's CSRF token, done by the
service layer (``outbox.operator``) as the console's login. A bulk action shows how many actions
it would touch and asks again before doing anything."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, flash, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from outbox import operator
from outbox.console import reads
from outbox.console.views import REFRESH_SECONDS, STATES, connection, state
from outbox.errors import ActionNotFound, UnknownKindError
from outbox.operator import BulkVerb, Outcome

blueprint = Blueprint("acting", __name__)

#: Longest note a resolution keeps (characters).
MAX_NOTE = 2000

#: What each bulk verb says on its buttons.
BULK_LABELS = {
    BulkVerb.RESOLVE_DELIVERED: "resolve UNCERTAIN as delivered",
    BulkVerb.RESOLVE_NOT_DELIVERED: "resolve UNCERTAIN as not delivered",
    BulkVerb.RESEND: "resolve UNCERTAIN as not delivered and send again",
    BulkVerb.RETRY: "retry FAILED or CANCELLED",
    BulkVerb.CANCEL: "cancel waiting",
    BulkVerb.ADMIT: "admit proposals",
    BulkVerb.REFUSE: "refuse proposals",
}


def _note() -> str | None:
    note = (request.form.get("note") or "").strip()[:MAX_NOTE]
    return note or None


def _back(action_id: int) -> Response:
    return redirect(url_for("views.action", action_id=action_id))


def _verb(action_id: int, done: str, call: Any) -> Response:
    """Runs one verb on one action; the action's page then says what happened or why not."""
    try:
        with connection() as conn:
            call(conn)
    except operator.OperatorRefused as refused:
        flash(f"Refused: {refused}", "error")
    except ActionNotFound as missing:
        flash(str(missing), "error")
    else:
        flash(done, "ok")
    return _back(action_id)


@blueprint.route("/actions/<int:action_id>/resolve", methods=["POST"])
def resolve(action_id: int) -> Response:
    choice = request.form.get("outcome", "")
    resend = choice == "resend"
    outcome = Outcome.DELIVERED if choice == "delivered" else Outcome.NOT_DELIVERED
    if choice not in ("delivered", "not-delivered", "resend"):
        flash("Choose delivered, not delivered, or not delivered and send again.", "error")
        return _back(action_id)
    note = _note()

    def call(conn: Any) -> None:
        done = operator.resolve(
            conn,
            action_id,
            outcome,
            actor=g.actor,
            note=note,
            resend=resend,
            schema=state()["schema"],
        )
        if done.resent is not None:
            flash(f"Sent again as #{done.resent.id}.", "ok")

    return _verb(action_id, f"Resolved {outcome.value}.", call)


@blueprint.route("/actions/<int:action_id>/retry", methods=["POST"])
def retry(action_id: int) -> Response:
    def call(conn: Any) -> None:
        new = operator.retry(conn, action_id, actor=g.actor, schema=state()["schema"])
        flash(f"Retried as #{new.id}.", "ok")

    return _verb(action_id, "Retry enqueued.", call)


@blueprint.route("/actions/<int:action_id>/cancel", methods=["POST"])
def cancel(action_id: int) -> Response:
    return _verb(
        action_id,
        "Cancelled.",
        lambda conn: operator.cancel(conn, action_id, actor=g.actor, schema=state()["schema"]),
    )


@blueprint.route("/actions/<int:action_id>/admit", methods=["POST"])
def admit(action_id: int) -> Response:
    return _verb(
        action_id,
        "Admitted.",
        lambda conn: operator.admit(conn, action_id, actor=g.actor, schema=state()["schema"]),
    )


@blueprint.route("/actions/<int:action_id>/refuse", methods=["POST"])
def refuse(action_id: int) -> Response:
    note = _note()
    return _verb(
        action_id,
        "Refused.",
        lambda conn: operator.refuse(
            conn, action_id, actor=g.actor, reason=note, schema=state()["schema"]
        ),
    )


@blueprint.route("/kinds/<kind>/pause", methods=["POST"])
def pause(kind: str) -> Response:
    try:
        with connection() as conn:
            operator.pause(conn, kind, actor=g.actor, note=_note(), schema=state()["schema"])
        flash(f"{kind} paused: the claimers claim none of its actions until resumed.", "ok")
    except UnknownKindError:
        flash(f"No kind {kind}.", "error")
    return redirect(_return_to())


@blueprint.route("/kinds/<kind>/resume", methods=["POST"])
def resume(kind: str) -> Response:
    with connection() as conn:
        was = operator.resume(conn, kind, actor=g.actor, schema=state()["schema"])
    flash(f"{kind} resumed." if was else f"{kind} was neither paused nor held.", "ok")
    return redirect(_return_to())


def _actions_url(where: reads.ActionFilter) -> str:
    args = where.query_args()
    return url_for("views.actions") + (f"?{urlencode(args)}" if args else "")


def _return_to() -> str:
    target = request.form.get("next") or "/"
    return target if target.startswith("/") and not target.startswith("//") else "/"


def bulk_filter(where: reads.ActionFilter) -> operator.ActionFilter:
    """The list's filter as the service layer's (which has no idempotency key or subject: a
    bulk form is not offered with those set)."""
    return operator.ActionFilter(
        kinds=(where.kind,) if where.kind else (),
        states=(where.state,) if where.state else (),
        reasons=(where.reason,) if where.reason else (),
        lanes=(where.lane_key,) if where.lane_key else (),
        created_from=where.since,
        created_to=where.until,
    )


@blueprint.route("/bulk", methods=["POST"])
def bulk() -> Response | str:
    """Step one: how many actions the verb would touch, and a button to go on. Step two
    (``confirm`` with the count shown): do it."""
    where = reads.ActionFilter.from_args(request.form)
    try:
        verb = BulkVerb(request.form.get("verb", ""))
    except ValueError:
        flash("Choose what to do with the matching actions.", "error")
        return redirect(_actions_url(where))
    if where.idempotency_key or where.subject:
        flash("Bulk actions take kind, state, reason, lane and time filters only.", "error")
        return redirect(_actions_url(where))
    schema = state()["schema"]
    scope = bulk_filter(where)
    with connection() as conn:
        if request.form.get("confirm") != "yes":
            count = operator.bulk_count(conn, verb, scope, schema=schema)
            return render_template(
                "bulk_confirm.html",
                refresh=REFRESH_SECONDS,
                states=STATES,
                verb=verb,
                label=BULK_LABELS[verb],
                count=count,
                where=where,
                note=_note(),
            )
        result = operator.bulk_apply(conn, verb, scope, actor=g.actor, note=_note(), schema=schema)
    flash(
        f"{BULK_LABELS[verb].capitalize()}: {result.applied} of {result.matched} done"
        + (f", {len(result.refused)} refused (they had moved on)" if result.refused else "")
        + ".",
        "ok",
    )
    return redirect(_actions_url(where))
