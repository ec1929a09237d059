"""Five minutes with the outbox: a kind, its adapter, an enqueue in the application's own
transaction, and a run. `python quickstart.py` runs everything in-process with `drain`."""

import psycopg

from outbox import Abandoned, ActionKind, ActionRequest, Done, Outbox, Retry
from outbox.testing import drain

# A sort of effect. Its provider can be searched for an earlier write, so it is a read-back
# kind (at_most_once=False): a retry after a crash looks before it posts again.
COMMENT = ActionKind("ISSUE_COMMENT")


class Tracker:
    """Stands in for an issue tracker's API: comments searchable by a marker."""

    def __init__(self) -> None:
        self.comments: dict[str, str] = {}

    async def find(self, marker: str) -> str | None:
        return marker if marker in self.comments else None

    async def post(self, issue: int, marker: str, text: str) -> str:
        self.comments[marker] = text
        print(f"posted on issue {issue}: {text}")
        return marker


class CommentAdapter:
    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    async def execute(self, attempt):
        marker = f"outbox:{attempt.idempotency_key}"
        if attempt.write_started:  # an earlier attempt may have posted: read back first
            found = await self.tracker.find(marker)
            if found:
                return Done(found)
        if not await attempt.fence().begin_write():  # right before the provider call
            return Abandoned()
        issue, feedback = attempt.payload["issue"], attempt.payload["feedback"]
        try:
            ref = await self.tracker.post(issue, marker, f"Feedback #{feedback} received")
        except ConnectionRefusedError:  # provably not written
            return Retry()
        return Done(ref)


outbox = Outbox()  # settings from OUTBOX_* environment variables
outbox.register(COMMENT, CommentAdapter(Tracker()))


def leave_feedback(conn: psycopg.Connection, issue: int, text: str) -> int:
    """The application's handler: its change and the action commit together, or neither does."""
    with conn.transaction():
        feedback_id = conn.execute(
            "INSERT INTO feedback (issue, text) VALUES (%s, %s) RETURNING id", (issue, text)
        ).fetchone()[0]
        outbox.enqueue(
            conn,
            ActionRequest(
                COMMENT,
                workspace_id="acme",
                lane_key=f"issue:{issue}",  # one issue's comments run one at a time, in order
                idempotency_key=f"feedback-comment:{feedback_id}",  # the effect's natural key
                payload={"issue": issue, "feedback": feedback_id},  # identifiers only
            ),
        )
    return feedback_id


if __name__ == "__main__":
    outbox.migrate()  # the outbox's tables; `outbox migrate quickstart:outbox` does the same
    with psycopg.connect(outbox.settings.require_database_url()) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS feedback"
            " (id bigserial PRIMARY KEY, issue int NOT NULL, text text NOT NULL)"
        )
        conn.commit()
        leave_feedback(conn, 7, "The export button does nothing")
        leave_feedback(conn, 7, "Still broken on Firefox")
    print(dict(drain(outbox).count()))  # {'done': 2}
