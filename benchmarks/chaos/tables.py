"""The soak's own tables, in two schemas beside the outbox's.

``<run>_world`` is the outside world: what the SMTP sink accepted, and what the HTTP providers
(the webhook receiver, the issue tracker, the chat API) took. ``<run>_watch`` is what the
harness observes: each attempt as the adapters saw it, each take of an action by a worker, each
process end (SIGKILL or clean stop), each erasure, each injected fault. Every row there is
written in its own short autocommit transaction, never inside an action's, so a kill loses at
most the row that was being written, and what is committed stays true; but a take is recorded
by a trigger on the outbox's table, in the take's own transaction, so it is committed exactly
when the take is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

DDL = """
CREATE SCHEMA IF NOT EXISTS {world};
CREATE SCHEMA IF NOT EXISTS {watch};

-- The HTTP providers (benchmarks/chaos/receivers.py). No unique constraint on any effect, on
-- purpose: a duplicate must be visible to the checks, not refused by the provider.
-- Each webhook endpoint (a slot in the receiver's URL) and the secret it verifies with.
CREATE TABLE IF NOT EXISTS {world}.webhook_endpoint (
    slot text PRIMARY KEY,
    subscription bigint NOT NULL,
    secret text NOT NULL);
-- Every verified delivery, resends included; `event` is the soak's event key @ the slot.
CREATE TABLE IF NOT EXISTS {world}.webhook_delivery (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id text NOT NULL,
    event text NOT NULL,
    slot text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS {world}.webhook_bad_signature (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot text NOT NULL,
    webhook_id text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT clock_timestamp());
-- Issue comments (GitHub's shape); `marker` is the digest in the body's hidden marker.
CREATE TABLE IF NOT EXISTS {world}.issue_comment (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner text NOT NULL,
    repo text NOT NULL,
    issue integer NOT NULL,
    body text NOT NULL,
    marker text NOT NULL,
    posted_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS ix_issue_comment_issue ON {world}.issue_comment (owner, repo, issue);
-- Chat messages (Slack's shape); `marker` is the one in the message's metadata.
CREATE TABLE IF NOT EXISTS {world}.chat_message (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel text NOT NULL,
    ts text NOT NULL,
    ts_num double precision NOT NULL,
    thread_ts text,
    text text NOT NULL,
    marker text NOT NULL,
    metadata text,
    posted_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS ix_chat_message_channel ON {world}.chat_message (channel);
-- Each fault a provider applied (best effort: not while the database is down).
CREATE TABLE IF NOT EXISTS {world}.http_fault_met (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL,
    fault text NOT NULL,
    key text NOT NULL);
-- Every message the SMTP sink accepted (replied, or was about to reply, 250 to).
CREATE TABLE IF NOT EXISTS {world}.smtp_accepted (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id text NOT NULL,
    recipient text NOT NULL,
    accepted_at timestamptz NOT NULL DEFAULT clock_timestamp());

-- One row per adapter call: inserted when it starts, updated around the fence and at its end.
CREATE TABLE IF NOT EXISTS {watch}.attempt (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id bigint NOT NULL,
    epoch bigint NOT NULL,
    attempt integer NOT NULL,
    kind text NOT NULL,
    lane text NOT NULL,
    pgid integer NOT NULL,          -- the process group the harness kills (claimer/worker)
    pid integer NOT NULL,
    write_started boolean NOT NULL, -- what the adapter saw: an earlier attempt passed its fence
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    fence_asked_at timestamptz,     -- committed before begin_write() was called
    fence_passed boolean,           -- its answer (NULL: killed before it was recorded)
    stopped_at timestamptz,
    result text,
    -- its lease's end by the database clock: it ends by then at the latest (the executor
    -- cancels it there), which bounds it when its stop could not be written (database down)
    deadline timestamptz);
CREATE INDEX IF NOT EXISTS ix_attempt_action ON {watch}.attempt (action_id, epoch);
-- Every time a worker's event loop ran a timer more than a tenth of a second late (the process
-- starved of CPU): a lease's cut is a loop timer too, so it came as late. `resumed_at` is when
-- the loop ran it (the process's clock), `lag` how late.
CREATE TABLE IF NOT EXISTS {watch}.stall (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pid integer NOT NULL,
    resumed_at timestamptz NOT NULL,
    lag double precision NOT NULL);
-- Every claimer or worker process that ended: SIGKILL by the harness, or a clean stop at the
-- end. `before`/`after` bracket the signal by the database clock.
CREATE TABLE IF NOT EXISTS {watch}.process_end (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pgid integer NOT NULL,
    role text NOT NULL,
    how text NOT NULL,
    before timestamptz NOT NULL,
    after timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS {watch}.erasure (
    account text PRIMARY KEY,
    erased integer NOT NULL,
    in_flight integer NOT NULL,
    committed_at timestamptz NOT NULL);
-- Every take of an action by a worker (the statement that sets taken_epoch), written by a
-- trigger in the take's own transaction: committed exactly when the take is.
CREATE TABLE IF NOT EXISTS {watch}.take (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id bigint NOT NULL,
    epoch bigint NOT NULL,
    attempt integer NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION {watch}.record_take() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {watch}.take (action_id, epoch, attempt) VALUES (NEW.id, NEW.epoch, NEW.attempt);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER chaos_record_take AFTER UPDATE OF taken_epoch ON {outbox}.agent_action
    FOR EACH ROW WHEN (NEW.taken_epoch IS NOT NULL
                       AND NEW.taken_epoch IS DISTINCT FROM OLD.taken_epoch)
    EXECUTE FUNCTION {watch}.record_take();
-- Every fault the harness injected besides the SIGKILLs (a server restart, a worker-pool
-- outage), bracketed by the database clock: `before` the fault began, `after` it ended.
CREATE TABLE IF NOT EXISTS {watch}.fault (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    before timestamptz NOT NULL,
    after timestamptz NOT NULL);
-- Every action the harness enqueued (and committed), with what the workload meant it to do.
CREATE TABLE IF NOT EXISTS {watch}.enqueued (
    action_id bigint PRIMARY KEY,
    kind text NOT NULL,
    marker text NOT NULL,
    lane text NOT NULL,
    account text,
    expires boolean NOT NULL,
    -- what the effect is known by at its provider: the email's Message-ID, the webhook-id,
    -- the issue comment's or chat message's marker
    effect_key text NOT NULL,
    -- the fault the provider applies to its first write (see receivers.py), or ''
    fault text NOT NULL DEFAULT '');
"""


@dataclass(frozen=True)
class Schemas:
    """The three schemas of one run: the outbox's, the world's and the watch's."""

    outbox: str

    @property
    def world(self) -> str:
        return f"{self.outbox}_world"

    @property
    def watch(self) -> str:
        return f"{self.outbox}_watch"

    def all(self) -> tuple[str, str, str]:
        return (self.outbox, self.world, self.watch)


def create(conn: psycopg.Connection[Any], schemas: Schemas) -> None:
    conn.execute(
        DDL.format(
            world=f'"{schemas.world}"', watch=f'"{schemas.watch}"', outbox=f'"{schemas.outbox}"'
        )
    )


def drop(conn: psycopg.Connection[Any], schemas: Schemas) -> None:
    for name in schemas.all():
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
