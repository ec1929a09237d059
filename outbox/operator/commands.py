"""``outbox resolve|retry|cancel|admit|refuse ID`` and their bulk forms, ``outbox pause|resume
KIND`` (registered in outbox.cli). Each calls the service layer (``outbox.operator``) as
``--as NAME`` (default: the OS user).

Without an ID, a verb applies to every action its filter options match (``--kind``, ``--state``,
``--reason``, ``--lane``, ``--created-from/--created-to``, ``--ended-from/--ended-to``, at least
one of them): it prints the count first, and with ``--dry-run`` stops there; otherwise it asks
for a confirmation unless ``--yes``. A refusal (resolve on an action that is not UNCERTAIN, ...)
prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg

from outbox.config import Settings
from outbox.operator import actions
from outbox.operator.audit import default_actor
from outbox.operator.bulk import bulk_apply, bulk_count
from outbox.operator.pausing import pause, resume
from outbox.operator.records import ActionFilter, BulkVerb, Outcome

_FILTERS = (
    "kind",
    "state",
    "reason",
    "lane",
    "created_from",
    "created_to",
    "ended_from",
    "ended_to",
)


def _timestamp(raw: str) -> datetime:
    """An ISO 8601 time; without a zone it is UTC."""
    try:
        value = datetime.fromisoformat(raw)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an ISO 8601 time") from error
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _connect(args: argparse.Namespace) -> tuple[Settings, psycopg.Connection[Any]]:
    settings = Settings.from_env(database_url=args.database_url, schema=args.schema)
    return settings, psycopg.connect(settings.require_database_url(), autocommit=True)


def _actor(args: argparse.Namespace) -> str:
    return str(args.actor or default_actor())


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--as", dest="actor", metavar="NAME", help="who is acting (default: OS user)")
    p.add_argument("--database-url", help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL)")
    p.add_argument("--schema", help="PostgreSQL schema (default: $OUTBOX_SCHEMA or outbox)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _bulk_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("id", nargs="?", type=int, metavar="ID", help="the action id (else: a filter)")
    group = p.add_argument_group("bulk (without ID): which actions")
    group.add_argument("--kind", action="append", default=[], help="a kind (repeatable)")
    group.add_argument("--state", action="append", default=[], help="a state (repeatable)")
    group.add_argument("--reason", action="append", default=[], help="a stop or retry reason")
    group.add_argument("--lane", action="append", default=[], help="a lane key (repeatable)")
    group.add_argument("--created-from", type=_timestamp, help="created at or after (ISO 8601)")
    group.add_argument("--created-to", type=_timestamp, help="created before (ISO 8601)")
    group.add_argument("--ended-from", type=_timestamp, help="ended at or after (ISO 8601)")
    group.add_argument("--ended-to", type=_timestamp, help="ended before (ISO 8601)")
    group.add_argument("--limit", type=int, help="at most this many")
    group.add_argument("--dry-run", action="store_true", help="print the count, change nothing")
    group.add_argument("--yes", action="store_true", help="apply without asking")


def _filter(args: argparse.Namespace) -> ActionFilter:
    return ActionFilter(
        kinds=tuple(args.kind),
        states=tuple(s.upper() for s in args.state),
        reasons=tuple(args.reason),
        lanes=tuple(args.lane),
        created_from=args.created_from,
        created_to=args.created_to,
        ended_from=args.ended_from,
        ended_to=args.ended_to,
        limit=args.limit,
    )


def _print(args: argparse.Namespace, value: dict[str, Any], line: str) -> None:
    if args.json:
        print(json.dumps(value, default=str, indent=2, sort_keys=True))
    else:
        print(line)


def _bulk(args: argparse.Namespace, verb: BulkVerb, note: str | None = None) -> int:
    if not any(getattr(args, name) for name in _FILTERS):
        print(
            f"outbox {args.command}: give an ID, or at least one filter (--kind, --state, "
            "--reason, --lane, --created-from/-to, --ended-from/-to) for the bulk form",
            file=sys.stderr,
        )
        return 2
    where = _filter(args)
    settings, conn = _connect(args)
    with conn:
        count = bulk_count(conn, verb, where, schema=settings.schema)
        print(
            f"{count} actions match for {verb.value}", file=sys.stderr if args.json else sys.stdout
        )
        if args.dry_run or count == 0:
            if args.json:
                print(json.dumps({"verb": verb.value, "matched": count, "applied": 0}))
            return 0
        if not args.yes:
            if not sys.stdin.isatty():
                print(
                    f"outbox {args.command}: not applied: confirm with --yes (no terminal to ask)",
                    file=sys.stderr,
                )
                return 1
            answer = input(f"{verb.value} {count} actions? [y/N] ").strip().lower()
            if answer not in ("y", "yes"):
                print("nothing changed")
                return 1
        result = bulk_apply(
            conn, verb, where, actor=_actor(args), note=note, schema=settings.schema
        )
    line = f"{verb.value}: {result.applied} of {result.matched} applied"
    if result.refused:
        line += (
            f", {len(result.refused)} refused ("
            + "; ".join(f"{i}: {why}" for i, why in list(result.refused.items())[:5])
            + ")"
        )
    if result.new_action_ids:
        line += f"; new actions {', '.join(map(str, result.new_action_ids[:20]))}"
    _print(args, result.as_dict(), line)
    return 0


def _single(
    args: argparse.Namespace, run: Callable[[psycopg.Connection[Any], str, str], Any]
) -> Any:
    settings, conn = _connect(args)
    with conn:
        return run(conn, _actor(args), settings.schema)


def _cmd_resolve(args: argparse.Namespace) -> int:
    if args.resend and args.delivered:
        print("outbox resolve: --resend goes with --not-delivered", file=sys.stderr)
        return 2
    outcome = Outcome.DELIVERED if args.delivered else Outcome.NOT_DELIVERED
    if args.id is None:
        verb = (
            BulkVerb.RESEND
            if args.resend
            else BulkVerb.RESOLVE_DELIVERED
            if args.delivered
            else BulkVerb.RESOLVE_NOT_DELIVERED
        )
        return _bulk(args, verb, args.note)
    done = _single(
        args,
        lambda conn, actor, schema: actions.resolve(
            conn, args.id, outcome, actor=actor, note=args.note, resend=args.resend, schema=schema
        ),
    )
    line = f"action {args.id} resolved {done.resolution.outcome} by {done.resolution.resolved_by}"
    if not done.created:
        line += " (already so resolved)"
    if done.resent is not None:
        line += f"; resent as action {done.resent.id}"
    _print(
        args,
        {
            "resolution": done.resolution.as_dict(),
            "created": done.created,
            "resent_id": done.resent.id if done.resent else None,
        },
        line,
    )
    return 0


def _cmd_retry(args: argparse.Namespace) -> int:
    if args.id is None:
        return _bulk(args, BulkVerb.RETRY)
    new = _single(
        args, lambda conn, actor, schema: actions.retry(conn, args.id, actor=actor, schema=schema)
    )
    _print(args, {"new_id": new.id}, f"action {args.id} retried as action {new.id}")
    return 0


def _ender(name: str, verb: BulkVerb) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        if args.id is None:
            return _bulk(args, verb, getattr(args, "reason_text", None))

        def run(conn: psycopg.Connection[Any], actor: str, schema: str) -> Any:
            if verb is BulkVerb.CANCEL:
                return actions.cancel(conn, args.id, actor=actor, schema=schema)
            if verb is BulkVerb.ADMIT:
                return actions.admit(conn, args.id, actor=actor, schema=schema)
            return actions.refuse(
                conn, args.id, actor=actor, reason=args.reason_text, schema=schema
            )

        action = _single(args, run)
        line = f"action {action.id} {name}: {action.state}"
        if action.stop_reason:
            line += f" {action.stop_reason}"
        _print(
            args, {"id": action.id, "state": action.state, "stop_reason": action.stop_reason}, line
        )
        return 0

    return command


def _cmd_pause(args: argparse.Namespace) -> int:
    found = _single(
        args,
        lambda conn, actor, schema: pause(
            conn, args.kind, actor=actor, note=args.note, schema=schema
        ),
    )
    _print(
        args,
        found.as_dict(),
        f"kind {found.kind} paused by {found.paused_by} at {found.paused_at:%Y-%m-%d %H:%M:%S %Z}",
    )
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    was = _single(
        args, lambda conn, actor, schema: resume(conn, args.kind, actor=actor, schema=schema)
    )
    _print(
        args,
        {"kind": args.kind, "was_paused": was},
        f"kind {args.kind} resumed" if was else f"kind {args.kind} was neither paused nor held",
    )
    return 0


def setup_operator(sub: argparse._SubParsersAction) -> None:
    """Adds the operator's verbs to the ``outbox`` command."""
    p = sub.add_parser("resolve", help="record what a person found about an UNCERTAIN action")
    _bulk_options(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--delivered", action="store_true", help="the provider has it")
    which.add_argument("--not-delivered", action="store_true", help="the provider has it not")
    p.add_argument("--note", help="what was found, and where")
    p.add_argument("--resend", action="store_true", help="with --not-delivered: send it again")
    _common(p)
    p.set_defaults(func=_cmd_resolve)

    p = sub.add_parser("retry", help="a new linked action for a FAILED or CANCELLED one")
    _bulk_options(p)
    _common(p)
    p.set_defaults(func=_cmd_retry)

    for name, verb, text in (
        ("cancel", BulkVerb.CANCEL, "cancel a waiting action (CANCELLED OPERATOR_CANCELLED)"),
        ("admit", BulkVerb.ADMIT, "admit a proposal"),
        ("refuse", BulkVerb.REFUSE, "refuse a proposal (CANCELLED REFUSED, or --because)"),
    ):
        p = sub.add_parser(name, help=text)
        _bulk_options(p)
        if verb is BulkVerb.REFUSE:
            p.add_argument("--because", dest="reason_text", help="the refusal's stop reason")
        _common(p)
        p.set_defaults(func=_ender(name + ("ed" if name == "admit" else "d"), verb))

    p = sub.add_parser("pause", help="the claimers claim nothing of a kind until resumed")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("--note", help="why")
    _common(p)
    p.set_defaults(func=_cmd_pause)

    p = sub.add_parser(
        "resume", help="the claimers claim a paused kind, or one a provider outage holds, again"
    )
    p.add_argument("kind", metavar="KIND")
    _common(p)
    p.set_defaults(func=_cmd_resume)
