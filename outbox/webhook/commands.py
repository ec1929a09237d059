"""``outbox webhooks add|list|disable|enable|rotate-secret|remove`` (registered in outbox.cli).

A bad URL, secret or event type is a usage error (argparse: exit 2, one line naming it); a
subscription id that does not exist prints one line and exits 1, as ``outbox inspect`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import psycopg

from outbox._io import Operation, run_sync
from outbox.cli_args import positive_int
from outbox.config import Settings
from outbox.webhook.address_guard import AddressRefused, check_endpoint_url
from outbox.webhook.signing import check_secret, new_secret
from outbox.webhook.subscriptions import (
    InvalidSubscription,
    Subscription,
    add_operation,
    check_event_type,
    disable_operation,
    enable_operation,
    get_operation,
    list_operation,
    remove_operation,
    set_secrets_operation,
)

#: Secrets a rotation keeps: the new one and the one before it, so receivers can switch over.
KEPT_ON_ROTATION = 2


def _url(raw: str) -> str:
    try:
        check_endpoint_url(raw)
    except AddressRefused as refused:
        raise argparse.ArgumentTypeError(f"endpoint URL: {refused}") from None
    return raw


def _secret(raw: str) -> str:
    try:
        return check_secret(raw)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _event_type(raw: str) -> str:
    try:
        return check_event_type(raw)
    except InvalidSubscription as error:
        raise argparse.ArgumentTypeError(error.message) from None


def _run(args: argparse.Namespace, op: Callable[[str], Operation[Any]]) -> Any:
    settings = Settings.from_env(database_url=args.database_url, schema=args.schema)
    with psycopg.connect(settings.require_database_url()) as conn:
        return run_sync(conn, op(settings.schema))


def _show(subscription: Subscription, *, secrets: bool = False) -> str:
    state = "enabled" if subscription.enabled else f"DISABLED ({subscription.disabled_reason})"
    events = ",".join(subscription.event_types)
    line = (
        f"#{subscription.id} {subscription.endpoint_url} events={events} "
        f"{state} failures={subscription.consecutive_failures} "
        f"secrets={len(subscription.secrets)}"
    )
    if secrets:
        line += "\n" + "\n".join(f"  secret: {s}" for s in subscription.secrets)
    return line


def _print(args: argparse.Namespace, subscription: Subscription, *, secrets: bool = False) -> None:
    if args.json:
        print(json.dumps(subscription.as_dict(show_secrets=secrets), default=str, indent=2))
    else:
        print(_show(subscription, secrets=secrets))


def _missing(args: argparse.Namespace) -> int:
    print(f"outbox webhooks {args.action}: no subscription {args.id}", file=sys.stderr)
    return 1


def _cmd_add(args: argparse.Namespace) -> int:
    secret = args.secret or new_secret()
    subscription = _run(args, lambda s: add_operation(s, args.url, [secret], args.event))
    # The secret is shown once, here (and by list --secrets): the receiver needs it to verify.
    _print(args, subscription, secrets=True)
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    found = _run(args, list_operation)
    if args.json:
        print(
            json.dumps([s.as_dict(show_secrets=args.secrets) for s in found], default=str, indent=2)
        )
    else:
        for subscription in found:
            print(_show(subscription, secrets=args.secrets))
        if not found:
            print("no webhook subscriptions")
    return 0


def _cmd_disable(args: argparse.Namespace) -> int:
    found = _run(args, lambda s: disable_operation(s, args.id, args.reason))
    if found is None:
        return _missing(args)
    _print(args, found)
    return 0


def _cmd_enable(args: argparse.Namespace) -> int:
    found = _run(args, lambda s: enable_operation(s, args.id))
    if found is None:
        return _missing(args)
    _print(args, found)
    return 0


def _rotate(schema: str, args: argparse.Namespace) -> Operation[Subscription | None]:
    current = yield from get_operation(schema, args.id)
    if current is None:
        return None
    if args.drop_old:
        secrets = current.secrets[:1]
    else:
        secrets = [args.secret or new_secret(), *current.secrets][:KEPT_ON_ROTATION]
    updated = yield from set_secrets_operation(schema, args.id, secrets)
    return updated


def _cmd_rotate(args: argparse.Namespace) -> int:
    found = _run(args, lambda s: _rotate(s, args))
    if found is None:
        return _missing(args)
    _print(args, found, secrets=not args.drop_old)
    return 0


def _cmd_remove(args: argparse.Namespace) -> int:
    if not _run(args, lambda s: remove_operation(s, args.id)):
        return _missing(args)
    print(f"removed subscription {args.id}; its waiting deliveries end CANCELLED")
    return 0


def _common(p: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int]) -> None:
    p.add_argument("--database-url", help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL)")
    p.add_argument("--schema", help="PostgreSQL schema (default: $OUTBOX_SCHEMA or outbox)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=func)


def setup_webhooks(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("webhooks", help="manage webhook subscriptions (the WEBHOOK kind)")
    actions = parser.add_subparsers(dest="action", required=True)

    p = actions.add_parser("add", help="subscribe an endpoint to event types; prints its secret")
    p.add_argument("url", type=_url, metavar="URL", help="the endpoint (http:// or https://)")
    p.add_argument(
        "--event",
        type=_event_type,
        action="append",
        required=True,
        help="an event type it receives (repeat; * for every event)",
    )
    p.add_argument("--secret", type=_secret, help="whsec_... (default: a new random secret)")
    _common(p, _cmd_add)

    p = actions.add_parser("list", help="every subscription, its state and failures")
    p.add_argument("--secrets", action="store_true", help="show the signing secrets")
    _common(p, _cmd_list)

    p = actions.add_parser("disable", help="stop delivering to a subscription (deliveries wait)")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--reason", default="OPERATOR", help="shown in outbox status")
    _common(p, _cmd_disable)

    p = actions.add_parser("enable", help="deliver again (the failure count starts afresh)")
    p.add_argument("id", type=positive_int, metavar="ID")
    _common(p, _cmd_enable)

    p = actions.add_parser(
        "rotate-secret",
        help="sign with a new secret and the previous one; --drop-old keeps only the newest",
    )
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--secret", type=_secret, help="whsec_... (default: a new random secret)")
    p.add_argument("--drop-old", action="store_true", help="stop signing with older secrets")
    _common(p, _cmd_rotate)

    p = actions.add_parser("remove", help="delete a subscription; its deliveries end CANCELLED")
    p.add_argument("id", type=positive_int, metavar="ID")
    _common(p, _cmd_remove)
