"""Standard Webhooks signatures, through the specification's reference package.

Each delivery carries ``webhook-id`` (the same on every attempt of one action, so a receiver
dedupes a resend), ``webhook-timestamp`` (this attempt's time, seconds since the epoch) and
``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` for each of the
subscription's secrets, space-separated, so that a receiver still on the previous secret of a
rotation accepts it too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets as random_secrets
from collections.abc import Sequence
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
#: Bytes of a generated secret (the specification asks for 24 to 64).
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh random signing secret, ``whsec_<base64 of 32 bytes>``."""
    return SECRET_PREFIX + base64.b64encode(random_secrets.token_bytes(SECRET_BYTES)).decode()


def check_secret(secret: str) -> str:
    """``secret`` if it is ``whsec_`` and the base64 of 24 to 64 bytes; else ValueError."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise ValueError("a signing secret starts with whsec_")
    try:
        text = secret[len(SECRET_PREFIX) :]
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a signing secret is whsec_ followed by base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("a signing secret holds 24 to 64 bytes")
    return secret


def webhook_id(idempotency_key: str) -> str:
    """``msg_<hash of the action's idempotency key>``: stable on every attempt of one action,
    and telling nothing of the key itself."""
    digest = hashlib.sha256(idempotency_key.encode("utf-8")).digest()[:18]
    return "msg_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def sign_headers(
    msg_id: str, body: str, secrets: Sequence[str], at: datetime | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers of one delivery of ``body``."""
    when = (at or datetime.now(UTC)).astimezone(UTC)
    signatures = " ".join(Webhook(secret).sign(msg_id, when, body) for secret in secrets)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": signatures,
    }
