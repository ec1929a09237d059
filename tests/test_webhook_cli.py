"""`outbox webhooks ...` manages subscriptions; a mistake is one line and exit 2 (usage) or 1
(no such subscription); `outbox status` lists disabled endpoints."""

from __future__ import annotations

import json

import pytest
from standardwebhooks.webhooks import Webhook

from outbox import Outbox
from outbox.cli import main
from outbox.webhook import sign_headers


@pytest.fixture
def common(database_url: str, schema: str) -> list[str]:
    Outbox(database_url, schema=schema).migrate()
    return ["--database-url", database_url, "--schema", schema]


def run_json(capsys, argv: list[str]):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_add_list_disable_enable_rotate_remove(common, capsys) -> None:
    added = run_json(
        capsys,
        [
            "webhooks",
            "add",
            "https://hooks.example.com/in",
            "--event",
            "a.b",
            "--event",
            "c",
            *common,
        ],
    )
    sid = added["id"]
    (secret,) = added["secrets"]
    assert secret.startswith("whsec_")
    assert added["event_types"] == ["a.b", "c"] and added["enabled"] is True

    listed = run_json(capsys, ["webhooks", "list", *common])
    assert [s["id"] for s in listed] == [sid]
    assert secret not in json.dumps(listed)  # secrets are shown only when asked for

    disabled = run_json(
        capsys, ["webhooks", "disable", str(sid), "--reason", "MAINTENANCE", *common]
    )
    assert (disabled["enabled"], disabled["disabled_reason"]) == (False, "MAINTENANCE")
    assert main(["status", *common]) == 0
    out = capsys.readouterr().out
    assert f"#{sid} https://hooks.example.com/in MAINTENANCE" in out
    status = run_json(capsys, ["status", *common])
    assert [d["id"] for d in status["disabled_webhook_endpoints"]] == [sid]

    enabled = run_json(capsys, ["webhooks", "enable", str(sid), *common])
    assert (enabled["enabled"], enabled["disabled_reason"]) == (True, None)
    assert main(["status", *common]) == 0
    assert "disabled webhook endpoints: none" in capsys.readouterr().out

    rotated = run_json(capsys, ["webhooks", "rotate-secret", str(sid), *common])
    new, old = rotated["secrets"]
    assert old == secret and new != secret
    # Both sign each delivery: a receiver on either verifies.
    headers = sign_headers("msg_x", "{}", rotated["secrets"])
    Webhook(old).verify("{}", headers)
    Webhook(new).verify("{}", headers)
    dropped = run_json(capsys, ["webhooks", "rotate-secret", str(sid), "--drop-old", *common])
    assert len(dropped["secrets"]) == 1

    assert main(["webhooks", "remove", str(sid), *common]) == 0
    assert "removed subscription" in capsys.readouterr().out
    assert run_json(capsys, ["webhooks", "list", *common]) == []


@pytest.mark.parametrize(
    ("argv", "status", "says"),
    [
        (["add", "ftp://x.example.com/", "--event", "a"], 2, "scheme must be http or https"),
        (["add", "https://x.example.com/", "--event", "has space"], 2, "letters, digits"),
        (["add", "https://x.example.com/", "--event", "a", "--secret", "nope"], 2, "whsec_"),
        (["add", "https://x.example.com/"], 2, "--event"),
        (["disable", "abc"], 2, "is not a whole number"),
        (["enable", "999"], 1, "no subscription 999"),
        (["remove", "999"], 1, "no subscription 999"),
        (["rotate-secret", "999"], 1, "no subscription 999"),
    ],
)
def test_a_mistake_is_one_clear_line(common, capsys, argv, status, says) -> None:
    try:
        code = main(["webhooks", *argv, *common])
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    assert code == status
    err = capsys.readouterr().err
    assert says in err
    assert "Traceback" not in err


def test_a_bad_webhook_setting_names_its_variable() -> None:
    from outbox.errors import ConfigurationError
    from outbox.webhook import WebhookSettings

    with pytest.raises(ConfigurationError, match="OUTBOX_WEBHOOK_ALLOW_PRIVATE: 'intranet'"):
        WebhookSettings.from_env({"OUTBOX_WEBHOOK_ALLOW_PRIVATE": "intranet"})
    with pytest.raises(ConfigurationError, match="OUTBOX_WEBHOOK_TIMEOUT_SECONDS"):
        WebhookSettings.from_env({"OUTBOX_WEBHOOK_TIMEOUT_SECONDS": "soon"})
    with pytest.raises(ConfigurationError, match="OUTBOX_WEBHOOK_DISABLE_AFTER_FAILURES"):
        WebhookSettings.from_env({"OUTBOX_WEBHOOK_DISABLE_AFTER_FAILURES": "0"})
    allowed = WebhookSettings.from_env({"OUTBOX_WEBHOOK_ALLOW_PRIVATE": "10.0.0.0/8, ::1/128"})
    assert len(allowed.address_policy.allowed) == 2
