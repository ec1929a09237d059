"""The subset of GitHub's REST API the issue comment adapter uses, served by a real local HTTP
server with injected faults: list an issue's comments (``per_page``, ``page``, ``Link``
headers) and create one. A request without the token is refused with 401."""

from __future__ import annotations

import itertools
import re
import threading

from tests.http_sink import FaultyHttpServer, Reply, Request

TOKEN = "ghp_test-token"
_PATH = re.compile(r"^/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")


class GitHubServer(FaultyHttpServer):
    def __init__(self) -> None:
        super().__init__(self.handle)
        self.comments: dict[tuple[str, str, int], list[dict]] = {}
        self._ids = itertools.count(1001)
        self._guard = threading.Lock()

    def add_comments(self, owner: str, repo: str, issue: int, bodies: list[str]) -> None:
        with self._guard:
            for body in bodies:
                self.comments.setdefault((owner, repo, issue), []).append(
                    {"id": next(self._ids), "body": body}
                )

    def on(self, owner: str, repo: str, issue: int) -> list[dict]:
        with self._guard:
            return list(self.comments.get((owner, repo, issue), []))

    def handle(self, request: Request) -> Reply:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return Reply(401, {"message": "Bad credentials"})
        match = _PATH.match(request.path)
        if match is None:
            return Reply(404, {"message": "Not Found"})
        key = (match[1], match[2], int(match[3]))
        if request.method == "POST":
            body = request.json()["body"]
            with self._guard:
                comment = {"id": next(self._ids), "body": body}
                self.comments.setdefault(key, []).append(comment)
            return Reply(201, comment)
        per_page = min(int(request.query.get("per_page", 30)), 100)
        page = int(request.query.get("page", 1))
        found = self.on(*key)
        chunk = found[(page - 1) * per_page : page * per_page]
        headers = {}
        if page * per_page < len(found):
            following = f"{self.url}{request.path}?per_page={per_page}&page={page + 1}"
            headers["link"] = f'<{following}>; rel="next"'
        return Reply(200, chunk, headers)

    def gets(self) -> list[Request]:
        return [r for r in self.requests if r.method == "GET"]
