-- 0007: the operator's side: every attempt on record, resolutions and links made by a person,
-- payloads parked for a person's decision, paused kinds, an audit of operator actions, and the
-- registry of live claimer and worker processes.
--
-- Every table is new (nothing here rewrites agent_action), so the migration is quick on a
-- populated installation. The action rows themselves never change after their end (the guard
-- trigger is untouched): whatever a person decides about an ended action is a row of its own.

-- One row per attempt: a worker's take of (action_id, epoch), or an in-process claim that is its
-- own take. Written by the statements that already record each step (take, fence, finish, lost
-- lease; sql/queries.sql), never by a statement of its own. Never the payload, an address or an
-- exception's text: the reason is the outbox's or the adapter's short code, the error an
-- exception's class name, the provider reference what the adapter chose to show (for email the
-- Message-ID and the relay's queue id).
CREATE TABLE agent_action_attempt (
    action_id       bigint NOT NULL REFERENCES agent_action (id) ON DELETE CASCADE,
    epoch           bigint NOT NULL,
    attempt         integer NOT NULL,
    claimed_at      timestamptz NOT NULL, -- the start of the claim's lease
    taken_at        timestamptz NOT NULL, -- a worker's take (the claim, in-process)
    fence_passed_at timestamptz,
    ended_at        timestamptz,
    -- DONE, UNCERTAIN, FAILED, CANCELLED, RETRY, DEFER; NULL while running, or when the attempt
    -- was lost (its lease ran out and the action was claimed again).
    result          text,
    reason          text,
    provider_ref    text,
    error_class     text,
    PRIMARY KEY (action_id, epoch)
)
-- A row is inserted by one step and updated by the next ones (fence, finish) within seconds:
-- room left on each page lets those updates stay on the page (HOT, no new index entry).
WITH (fillfactor = 50);

-- What a person found out about an UNCERTAIN action (or decided about a FAILED or CANCELLED one):
-- one row an action; the action row itself never changes.
CREATE TABLE agent_action_resolution (
    action_id   bigint PRIMARY KEY REFERENCES agent_action (id) ON DELETE CASCADE,
    outcome     text NOT NULL CHECK (outcome IN ('DELIVERED', 'NOT_DELIVERED')),
    note        text,
    resolved_by text NOT NULL,
    resolved_at timestamptz NOT NULL DEFAULT now()
);

-- A new action an operator made from an ended one (a resend after NOT_DELIVERED, a retry of a
-- FAILED or CANCELLED one): the chain is readable from both ends. Erasing either end erases the
-- link.
CREATE TABLE agent_action_link (
    from_id    bigint NOT NULL REFERENCES agent_action (id) ON DELETE CASCADE,
    to_id      bigint NOT NULL REFERENCES agent_action (id) ON DELETE CASCADE,
    relation   text NOT NULL CHECK (relation IN ('RESEND', 'RETRY')),
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (from_id, to_id)
);
CREATE INDEX ix_agent_action_link_to ON agent_action_link (to_id);

-- The payload of an action that ended UNCERTAIN, FAILED or CANCELLED, kept for a person's
-- decision (a resend or a retry needs it) while agent_action keeps none once ended. Dropped when
-- the decision is taken, by maintenance after OUTBOX_PARKED_PAYLOAD_RETENTION, and with its
-- action (retention, erasure).
CREATE TABLE agent_action_parked_payload (
    action_id bigint PRIMARY KEY REFERENCES agent_action (id) ON DELETE CASCADE,
    payload   jsonb NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_agent_action_parked_payload_at ON agent_action_parked_payload (parked_at);

-- Kinds an operator paused: the claimers claim none of their actions until resumed.
CREATE TABLE agent_action_kind_pause (
    kind      text PRIMARY KEY REFERENCES agent_action_kind (name) ON DELETE CASCADE,
    paused_by text NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    note      text
);

-- Every operator action: who, when, which verb, on what. Kept apart from the actions so that an
-- erasure does not erase who erased what (action_id is a plain number here, not a reference).
CREATE TABLE outbox_operator_audit (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    verb      text NOT NULL,
    action_id bigint,
    kind      text,
    outcome   text NOT NULL,
    detail    jsonb
);
CREATE INDEX ix_outbox_operator_audit_action ON outbox_operator_audit (action_id)
    WHERE action_id IS NOT NULL;
CREATE INDEX ix_outbox_operator_audit_at ON outbox_operator_audit (at);

-- Each claimer and worker process upserts its row every few seconds, off the hot path.
CREATE TABLE outbox_process (
    process_id text PRIMARY KEY,  -- host:pid:start, unique per process life
    role       text NOT NULL CHECK (role IN ('claimer', 'worker')),
    host       text NOT NULL,
    pid        integer NOT NULL,
    kinds      text[] NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL DEFAULT now(),
    in_flight  integer NOT NULL DEFAULT 0 CHECK (in_flight >= 0)
);
CREATE INDEX ix_outbox_process_last_seen ON outbox_process (last_seen);
