"""A webhook receiver as the Standard Webhooks specification asks one to be: it verifies every
request's signature with the reference package and takes each ``webhook-id`` once."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.http_sink import FaultyHttpServer, Reply, Request


class WebhookReceiver(FaultyHttpServer):
    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__(self.receive)
        self.verifiers = [Webhook(s) for s in secrets]
        self.accepted: dict[str, dict] = {}  # webhook-id -> the event, taken once
        self.bad_signatures = 0
        self.redirect_to: str | None = None
        self._seen = threading.Lock()

    def verified(self, request: Request) -> dict | None:
        for verifier in self.verifiers:
            try:
                return verifier.verify(request.body, request.headers)
            except WebhookVerificationError:
                continue
        return None

    def receive(self, request: Request) -> Reply:
        if self.redirect_to is not None:
            return Reply(302, None, {"location": self.redirect_to})
        event = self.verified(request)
        if event is None:
            with self._seen:
                self.bad_signatures += 1
            return Reply(401, {"error": "bad signature"})
        with self._seen:
            self.accepted.setdefault(request.headers["webhook-id"], event)
        return Reply(200, {"ok": True})

    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST"]
