"""WebhookAdapter against a real local receiver with injected faults, on a real PostgreSQL
schema. The receiver verifies every signature with the Standard Webhooks reference package and
takes each webhook-id once, as the specification asks of a receiver."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionState, InvalidActionRequest
from outbox.results import Defer, Done, Retry
from outbox.testing import drain
from outbox.webhook import AddressPolicy, enqueue_webhook, new_secret, webhook_id
from tests.email_support import run_one_round
from tests.webhook_receiver import WebhookReceiver
from tests.webhook_support import Hooks, make_hooks, receiver_for


@pytest.fixture
def hooks(make_outbox, database_url: str, schema: str) -> Hooks:
    return make_hooks(make_outbox, database_url, schema)


@pytest.fixture
def receiver(hooks: Hooks) -> Iterator[WebhookReceiver]:
    server = receiver_for(hooks)
    yield server
    server.stop()


def results(report) -> list[tuple[str, str | None]]:
    return [(type(o.result).__name__, getattr(o.result, "reason", None)) for o in report.outcomes]


def test_a_delivery_is_signed_and_done_with_its_webhook_id_never_the_body(
    hooks: Hooks, receiver: WebhookReceiver
) -> None:
    sub = hooks.subscribe(receiver.url, ("invoice.paid",))
    (action_id,) = hooks.send()
    report = drain(hooks.outbox)

    action = hooks.action(action_id)
    assert action.state is ActionState.DONE
    msg_id = webhook_id(action.idempotency_key)
    assert action.readback_ref == f"{msg_id} HTTP 200"
    assert receiver.bad_signatures == 0
    assert list(receiver.accepted) == [msg_id]
    event = receiver.accepted[msg_id]
    assert event["type"] == "invoice.paid" and event["data"] == {"invoice": 1}
    (post,) = receiver.posts()
    assert post.headers["content-type"] == "application/json"
    assert post.headers["webhook-signature"].startswith("v1,")
    assert action.lane_key == f"webhook:{sub.id}"
    assert results(report) == [("Done", None)]


@pytest.mark.parametrize("fault", ["timeout:2", "500-after", "reset"])
def test_an_ambiguous_failure_after_the_write_is_resent_and_taken_once_by_the_receiver(
    hooks: Hooks, receiver: WebhookReceiver, fault: str
) -> None:
    hooks.subscribe(receiver.url)
    receiver.inject(fault)
    (action_id,) = hooks.send()
    report = drain(hooks.outbox)

    action = hooks.action(action_id)
    assert action.state is ActionState.DONE  # never UNCERTAIN: the receiver dedupes
    posts = receiver.posts()
    assert len(posts) == 2  # the endpoint took the first, the answer was lost, so it was resent
    assert {p.headers["webhook-id"] for p in posts} == {webhook_id(action.idempotency_key)}
    assert len(receiver.accepted) == 1  # exactly one accepted delivery
    assert receiver.bad_signatures == 0
    assert [type(o.result) for o in report.outcomes] == [Retry, Done]


def test_a_rate_limit_defers_for_the_retry_after_given_back_and_capped(
    hooks: Hooks, receiver: WebhookReceiver
) -> None:
    hooks.subscribe(receiver.url)
    receiver.inject("status:429:7")
    receiver.inject("status:503:999999")
    (action_id,) = hooks.send()
    report = drain(hooks.outbox)

    first, second, last = (o.result for o in report.outcomes)
    assert first == Defer(timedelta(seconds=7), "HTTP_429")
    assert second == Defer(hooks.adapter.settings.max_retry_after, "HTTP_503")  # capped
    assert isinstance(last, Done)
    action = hooks.action(action_id)
    assert action.state is ActionState.DONE
    assert action.attempt == 1  # a deferral spends no attempt
    assert len(receiver.accepted) == 1


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("status:500", [("Retry", "HTTP_500"), ("Done", None)]),
        ("status:503", [("Retry", "HTTP_503"), ("Done", None)]),  # no Retry-After: a 5xx
    ],
)
def test_a_server_error_is_retried(
    hooks: Hooks, receiver: WebhookReceiver, fault: str, expected
) -> None:
    hooks.subscribe(receiver.url)
    receiver.inject(fault)
    hooks.send()
    assert results(drain(hooks.outbox)) == expected
    assert len(receiver.accepted) == 1


def test_a_client_error_fails_and_410_cancels_and_disables_the_subscription(
    hooks: Hooks, receiver: WebhookReceiver
) -> None:
    sub = hooks.subscribe(receiver.url)
    receiver.inject("status:422")
    (failed,) = hooks.send(key="a")
    drain(hooks.outbox)
    assert (hooks.action(failed).state, hooks.action(failed).stop_reason) == (
        ActionState.FAILED,
        "HTTP_422",
    )
    assert hooks.subscription(sub.id)["consecutive_failures"] == 1

    receiver.inject("status:410")
    (gone,) = hooks.send(key="b")
    drain(hooks.outbox)
    assert (hooks.action(gone).state, hooks.action(gone).stop_reason) == (
        ActionState.CANCELLED,
        "WEBHOOK_GONE",
    )
    row = hooks.subscription(sub.id)
    assert (row["enabled"], row["disabled_reason"]) == (False, "ENDPOINT_GONE_410")
    assert receiver.accepted == {}


def test_a_redirect_is_not_followed(hooks: Hooks, receiver: WebhookReceiver) -> None:
    elsewhere = WebhookReceiver([hooks.secret]).start()
    try:
        receiver.redirect_to = elsewhere.url
        hooks.subscribe(receiver.url)
        (action_id,) = hooks.send()
        drain(hooks.outbox)
        assert hooks.action(action_id).stop_reason == "HTTP_302"
        assert elsewhere.requests == []
    finally:
        elsewhere.stop()


def test_an_endpoint_failing_n_times_in_a_row_is_disabled_its_deliveries_wait_until_enabled(
    make_outbox, database_url: str, schema: str, receiver: WebhookReceiver
) -> None:
    from outbox.cli import main

    hooks = make_hooks(make_outbox, database_url, schema, disable_after_failures=3)
    receiver.verifiers = WebhookReceiver([hooks.secret]).verifiers
    sub = hooks.subscribe(receiver.url)
    receiver.inject("status:500", times=3)
    (first,) = hooks.send(key="one")
    (second,) = hooks.send(key="two")
    seen = [o.result for _ in range(3) for o in run_one_round(hooks.outbox)]
    assert [r.reason for r in seen] == ["HTTP_500"] * 3
    row = hooks.subscription(sub.id)
    assert (row["enabled"], row["disabled_reason"]) == (False, "3_CONSECUTIVE_FAILURES")

    # Disabled: the next attempts wait without spending an attempt or reaching the endpoint.
    for _ in range(2):
        (outcome,) = run_one_round(hooks.outbox)
        assert outcome.result == Defer(timedelta(minutes=5), "WEBHOOK_ENDPOINT_DISABLED")
    assert len(receiver.posts()) == 3
    assert hooks.action(first).attempt == 3
    assert hooks.action(first).state is ActionState.ADMITTED

    common = ["--database-url", database_url, "--schema", schema]
    assert main(["webhooks", "enable", str(sub.id), *common]) == 0
    report = drain(hooks.outbox)
    assert [hooks.action(i).state for i in (first, second)] == [ActionState.DONE] * 2
    assert len(receiver.accepted) == 2
    assert hooks.subscription(sub.id)["consecutive_failures"] == 0
    assert report.count()["done"] == 2


def test_a_removed_subscription_cancels_its_waiting_deliveries(
    hooks: Hooks, receiver: WebhookReceiver
) -> None:
    sub = hooks.subscribe(receiver.url)
    (action_id,) = hooks.send()
    with psycopg.connect(hooks.database_url) as conn:
        conn.execute(f'DELETE FROM "{hooks.schema}".webhook_subscription WHERE id = %s', (sub.id,))
    drain(hooks.outbox)
    action = hooks.action(action_id)
    assert (action.state, action.stop_reason) == (
        ActionState.CANCELLED,
        "WEBHOOK_SUBSCRIPTION_REMOVED",
    )
    assert receiver.requests == []


def test_during_a_rotation_receivers_on_either_secret_verify_every_delivery(
    hooks: Hooks,
) -> None:
    old, new = new_secret(), new_secret()
    on_old = WebhookReceiver([old]).start()
    on_new = WebhookReceiver([new]).start()
    try:
        hooks.subscribe(on_old.url, secrets=[new, old])
        hooks.subscribe(on_new.url, secrets=[new, old])
        hooks.send()
        drain(hooks.outbox)
        assert (len(on_old.accepted), len(on_new.accepted)) == (1, 1)
        assert on_old.bad_signatures == on_new.bad_signatures == 0
        signature = on_old.posts()[0].headers["webhook-signature"]
        assert len(signature.split(" ")) == 2
    finally:
        on_old.stop()
        on_new.stop()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]"])
def test_a_non_public_endpoint_is_refused_before_any_request_unless_allowed(
    make_outbox, database_url: str, schema: str, receiver: WebhookReceiver, host: str
) -> None:
    hooks = make_hooks(make_outbox, database_url, schema, address_policy=AddressPolicy())
    hooks.subscribe(f"http://{host}:{receiver.port}/hook")
    (action_id,) = hooks.send()
    drain(hooks.outbox)
    action = hooks.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.FAILED, "WEBHOOK_ADDRESS_REFUSED")
    assert action.write_started_at is None  # refused before the fence
    assert receiver.requests == []


def test_enqueue_makes_one_delivery_per_enabled_matching_subscription_in_the_callers_transaction(
    hooks: Hooks, receiver: WebhookReceiver
) -> None:
    paid = hooks.subscribe(receiver.url, ("invoice.paid",))
    every = hooks.subscribe(receiver.url, ("*",))
    hooks.subscribe(receiver.url, ("invoice.voided",))
    off = hooks.subscribe(receiver.url, ("invoice.paid",))
    with psycopg.connect(hooks.database_url) as conn:
        conn.execute(
            f'UPDATE "{hooks.schema}".webhook_subscription SET enabled = false, '
            "disabled_at = now() WHERE id = %s",
            (off.id,),
        )
        conn.commit()
        rolled_back = enqueue_webhook(
            conn, "invoice.paid", {"invoice": 9}, idempotency_key="k9", schema=hooks.schema
        )
        assert len(rolled_back) == 2
        conn.rollback()
        assert conn.execute(f'SELECT count(*) FROM "{hooks.schema}".agent_action').fetchone() == (
            0,
        )
        first = enqueue_webhook(
            conn, "invoice.paid", {"invoice": 9}, idempotency_key="k9", schema=hooks.schema
        )
        again = enqueue_webhook(
            conn, "invoice.paid", {"invoice": 9}, idempotency_key="k9", schema=hooks.schema
        )
        conn.commit()
    assert [a.lane_key for a in first] == [f"webhook:{paid.id}", f"webhook:{every.id}"]
    assert [a.id for a in again] == [a.id for a in first]
    assert first[0].payload["subscription"] == paid.id
    assert first[0].payload["type"] == "invoice.paid"
    assert first[0].payload["data"] == {"invoice": 9}


def test_enqueue_refuses_data_over_the_payload_limit_naming_the_payload(
    hooks: Hooks, receiver: WebhookReceiver, conn
) -> None:
    hooks.subscribe(receiver.url)
    with pytest.raises(InvalidActionRequest) as refused:
        enqueue_webhook(
            conn,
            "invoice.paid",
            {"blob": "x" * 2000},
            idempotency_key="big",
            schema=hooks.schema,
            max_payload_bytes=1000,
        )
    assert refused.value.field == "payload"
    with pytest.raises(InvalidActionRequest) as bad_type:
        enqueue_webhook(conn, "no spaces", {}, idempotency_key="k", schema=hooks.schema)
    assert bad_type.value.field == "event_type"
