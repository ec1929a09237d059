-- 0001: the action table, its kinds, its lanes, and the guard trigger.
--
-- The runner (outbox/migrate.py) applies this file with search_path set to the configured
-- schema, so names here are unqualified; functions capture that search_path
-- (SET search_path FROM CURRENT) so they work whatever the caller's search_path is.

CREATE TABLE agent_action_kind (
    name           text PRIMARY KEY CHECK (name ~ '^[A-Z][A-Z0-9_]{0,62}$'),
    at_most_once   boolean NOT NULL,
    instance_level boolean NOT NULL,
    declared_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE agent_action (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind               text NOT NULL REFERENCES agent_action_kind (name),
    state              text NOT NULL DEFAULT 'ADMITTED',
    workspace_id       text,
    lane_key           text NOT NULL,
    idempotency_key    text NOT NULL,
    payload            jsonb,
    subject_account_id text,
    max_attempts       integer NOT NULL DEFAULT 5,
    expires_at         timestamptz,
    attempt            integer NOT NULL DEFAULT 0,
    epoch              bigint NOT NULL DEFAULT 0,
    available_at       timestamptz NOT NULL DEFAULT now(),
    lease_until        timestamptz,
    write_started_at   timestamptz,
    readback_ref       text,
    stop_reason        text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    ended_at           timestamptz,
    CONSTRAINT ck_agent_action_state CHECK (
        state IN ('PROPOSED', 'ADMITTED', 'EXECUTING', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')),
    CONSTRAINT ck_agent_action_lane_key CHECK (lane_key <> ''),
    CONSTRAINT ck_agent_action_idempotency_key CHECK (idempotency_key <> ''),
    CONSTRAINT ck_agent_action_max_attempts CHECK (max_attempts >= 1),
    CONSTRAINT ck_agent_action_counters CHECK (attempt >= 0 AND epoch >= 0),
    -- An ended action has a stop reason and an end time, and keeps no payload; a live one is the
    -- opposite of all three.
    CONSTRAINT ck_agent_action_stop_reason CHECK (
        (state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')) = (stop_reason IS NOT NULL)),
    CONSTRAINT ck_agent_action_ended_at CHECK (
        (state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')) = (ended_at IS NOT NULL)),
    CONSTRAINT ck_agent_action_payload CHECK (
        (state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')) = (payload IS NULL)),
    -- A waiting action holds no lease and no fence: a retry clears both.
    CONSTRAINT ck_agent_action_waiting_unfenced CHECK (
        state NOT IN ('PROPOSED', 'ADMITTED') OR (lease_until IS NULL AND write_started_at IS NULL)),
    CONSTRAINT ck_agent_action_executing_leased CHECK (
        state <> 'EXECUTING' OR lease_until IS NOT NULL),
    CONSTRAINT ux_agent_action_idempotency_key UNIQUE (idempotency_key)
);

-- One executing action per lane, even when two claimers race.
CREATE UNIQUE INDEX ux_agent_action_lane_executing
    ON agent_action (lane_key) WHERE state = 'EXECUTING';
-- The next waiting action of a lane: an index probe, however long the lane's backlog.
CREATE INDEX ix_agent_action_lane_waiting
    ON agent_action (lane_key, id) WHERE state IN ('PROPOSED', 'ADMITTED');
-- Reclaims and lease housekeeping read only executing rows.
CREATE INDEX ix_agent_action_lease
    ON agent_action (lease_until) WHERE state = 'EXECUTING';
-- Expiry reads only waiting rows that can expire.
CREATE INDEX ix_agent_action_expiry
    ON agent_action (expires_at) WHERE state IN ('PROPOSED', 'ADMITTED') AND expires_at IS NOT NULL;
-- The backlog per kind (status, metrics): only admitted rows.
CREATE INDEX ix_agent_action_due
    ON agent_action (kind, available_at) WHERE state = 'ADMITTED';
-- Retention reads only ended rows, oldest first.
CREATE INDEX ix_agent_action_ended
    ON agent_action (ended_at) WHERE ended_at IS NOT NULL;
-- Erasure by subject.
CREATE INDEX ix_agent_action_subject
    ON agent_action (subject_account_id) WHERE subject_account_id IS NOT NULL;

-- One row per lane that has a waiting or executing action, kept in step with agent_action by
-- the triggers below, in the same transactions. A claim reads lane heads from here, so its cost
-- is what the due heads cost, not what the backlog behind them costs.
CREATE TABLE agent_action_lane (
    lane_key     text PRIMARY KEY,
    head_id      bigint,      -- the smallest waiting (PROPOSED or ADMITTED) action, if any
    head_kind    text,
    head_due_at  timestamptz, -- the head's available_at while it is ADMITTED; NULL while PROPOSED
    executing_id bigint       -- the lane's EXECUTING action, if any
);

CREATE INDEX ix_agent_action_lane_ready
    ON agent_action_lane (head_kind, head_due_at) WHERE executing_id IS NULL AND head_due_at IS NOT NULL;

CREATE FUNCTION guard_agent_action() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ended constant text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    allowed boolean;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'guard_agent_action: a new action starts PROPOSED or ADMITTED, not %',
                NEW.state USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.epoch <> 0 OR NEW.attempt <> 0 THEN
            RAISE EXCEPTION 'guard_agent_action: a new action starts at epoch 0 and attempt 0'
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.workspace_id IS NULL AND NOT coalesce(
            (SELECT k.instance_level FROM agent_action_kind k WHERE k.name = NEW.kind), true) THEN
            RAISE EXCEPTION 'guard_agent_action: kind % is not instance-level, workspace_id is required',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.state = ANY (ended) THEN
        RAISE EXCEPTION 'guard_agent_action: action % ended % and never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.kind IS DISTINCT FROM OLD.kind
       OR NEW.lane_key IS DISTINCT FROM OLD.lane_key
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key
       OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'guard_agent_action: id, kind, lane_key, idempotency_key, workspace_id and created_at of action % never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- The transition table; outbox.state.ActionState carries the same one.
    allowed := CASE OLD.state
        WHEN 'PROPOSED' THEN NEW.state IN ('PROPOSED', 'ADMITTED', 'CANCELLED')
        WHEN 'ADMITTED' THEN NEW.state IN ('ADMITTED', 'EXECUTING', 'CANCELLED')
        WHEN 'EXECUTING' THEN NEW.state <> 'PROPOSED'
        ELSE false
    END;
    IF NOT allowed THEN
        RAISE EXCEPTION 'guard_agent_action: action % may not go from % to %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim is the only change of epoch, and every claim raises it (and the attempt) by one.
    IF NEW.epoch IS DISTINCT FROM OLD.epoch OR (NEW.state = 'EXECUTING' AND OLD.state <> 'EXECUTING') THEN
        IF NEW.state <> 'EXECUTING' OR NEW.epoch IS DISTINCT FROM OLD.epoch + 1 THEN
            RAISE EXCEPTION 'guard_agent_action: action % epoch % -> %: the epoch rises by exactly one, and only on a claim',
                OLD.id, OLD.epoch, NEW.epoch USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.attempt IS DISTINCT FROM OLD.attempt + 1 THEN
            RAISE EXCEPTION 'guard_agent_action: action % attempt % -> %: a claim raises the attempt by one',
                OLD.id, OLD.attempt, NEW.attempt USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL AND
           (SELECT k.at_most_once FROM agent_action_kind k WHERE k.name = OLD.kind) THEN
            RAISE EXCEPTION 'guard_agent_action: at-most-once action % started its write and is never claimed again', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER guard_agent_action
    BEFORE INSERT OR UPDATE ON agent_action
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();

-- Recomputes one lane's row from agent_action. The lane row is locked first, so concurrent
-- refreshes and enqueues of one lane serialise; each query after the lock sees what committed.
CREATE FUNCTION agent_action_lane_refresh(p_lane text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    head record;
    executing bigint;
BEGIN
    PERFORM 1 FROM agent_action_lane WHERE lane_key = p_lane FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_action_lane (lane_key) VALUES (p_lane) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_action_lane WHERE lane_key = p_lane FOR UPDATE;
    END IF;
    SELECT a.id, a.kind, a.state, a.available_at INTO head
      FROM agent_action a
     WHERE a.lane_key = p_lane AND a.state IN ('PROPOSED', 'ADMITTED')
     ORDER BY a.id LIMIT 1;
    SELECT a.id INTO executing FROM agent_action a WHERE a.lane_key = p_lane AND a.state = 'EXECUTING';
    IF head.id IS NULL AND executing IS NULL THEN
        DELETE FROM agent_action_lane WHERE lane_key = p_lane;
    ELSE
        UPDATE agent_action_lane l
           SET head_id = head.id,
               head_kind = head.kind,
               head_due_at = CASE WHEN head.state = 'ADMITTED' THEN head.available_at END,
               executing_id = executing
         WHERE l.lane_key = p_lane
           AND (l.head_id, l.head_kind, l.head_due_at, l.executing_id) IS DISTINCT FROM
               (head.id, head.kind, CASE WHEN head.state = 'ADMITTED' THEN head.available_at END, executing);
    END IF;
END;
$$;

CREATE FUNCTION agent_action_lane_track() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Ids rise, so a new action becomes the head only of a lane without one (or, when
        -- transactions commit out of id order, of a lane whose head is younger).
        INSERT INTO agent_action_lane AS l (lane_key, head_id, head_kind, head_due_at)
        VALUES (NEW.lane_key, NEW.id, NEW.kind,
                CASE WHEN NEW.state = 'ADMITTED' THEN NEW.available_at END)
        ON CONFLICT (lane_key) DO UPDATE
           SET head_id = excluded.head_id, head_kind = excluded.head_kind,
               head_due_at = excluded.head_due_at
         WHERE l.head_id IS NULL OR l.head_id > excluded.head_id;
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        IF OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') THEN
            PERFORM agent_action_lane_refresh(OLD.lane_key);
        END IF;
        RETURN NULL;
    END IF;
    -- UPDATE: only a change of state, or of a waiting action's due time, moves a lane.
    IF NEW.state IS DISTINCT FROM OLD.state
       OR (NEW.state = 'ADMITTED' AND NEW.available_at IS DISTINCT FROM OLD.available_at) THEN
        PERFORM agent_action_lane_refresh(NEW.lane_key);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER agent_action_lane_track
    AFTER INSERT OR UPDATE OR DELETE ON agent_action
    FOR EACH ROW EXECUTE FUNCTION agent_action_lane_track();

-- Wakes claimers (LISTEN outbox_<schema>) once per enqueueing statement.
CREATE FUNCTION agent_action_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('outbox_' || current_schema(), '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER agent_action_notify
    AFTER INSERT ON agent_action
    FOR EACH STATEMENT EXECUTE FUNCTION agent_action_notify();
