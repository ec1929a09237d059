-- 0005: the caller's transaction never locks a lane row, and an attempt counts a run.
--
-- Lane intake. Until now an enqueue upserted its lanes' rows, and an admit, a refusal or an
-- erasure refreshed them, inside the caller's transaction: the caller held those lane-row locks
-- until it committed, while the workers' group-committed finishes lock lane rows too, in the
-- order of their batch. A caller that enqueued over many lanes (a newsletter: a lane a person)
-- could deadlock with a finishing batch and lose its business transaction. Now a change that
-- involves no executing action (an insert, an admit, a refusal, an expiry, an erasure, a waiting
-- action's new due time) only appends the lane's key to agent_action_lane_intake, a table that
-- nothing else locks. The outbox's own processes fold the intake into agent_action_lane at the
-- start of every claim (agent_action_lane_intake()), taking lane rows with SKIP LOCKED: a lane
-- row held by a finish is left, with its intake rows, for the next claim. A change that involves
-- an executing action (a claim, a finish, a retry, a deferral, a lost lease) refreshes its lane
-- at once, as before: only the outbox's processes make those.
--
-- Attempts count runs. A claim raises the epoch only; a worker's take raises the attempt (and
-- starts the lease afresh), so claims whose messages no worker consumed cost no attempt.

CREATE TABLE agent_action_lane_intake (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lane_key   text NOT NULL,
    busy_until timestamptz  -- an erased write's lease end: its lane is held until then
);

-- The reason of the latest attempt that did not end the action (a retry or a deferral), kept
-- when the attempts run out so FAILED ATTEMPTS_EXHAUSTED says what kept failing.
ALTER TABLE agent_action ADD COLUMN retry_reason text;

-- When an earlier attempt of this action started its write. A retry or a deferral clears the
-- fence (a waiting action holds none) but keeps this, so a read-back adapter still looks for
-- that write before writing again, however the later attempts failed (an error before their
-- own fence, a lease that ran out before the write, a provider's 5xx).
ALTER TABLE agent_action ADD COLUMN earlier_write_at timestamptz;

-- An insert: the guard's rules for new actions (as in 0004), then its lanes into the intake,
-- then the claimers' wake-up.
CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    bad record;
BEGIN
    SELECT n.id, n.kind, n.state, n.epoch, n.attempt INTO bad
      FROM new_actions n
      LEFT JOIN agent_action_kind k ON k.name = n.kind
     WHERE n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
        OR (n.workspace_id IS NULL AND NOT coalesce(k.instance_level, true))
     ORDER BY n.id
     LIMIT 1;
    IF FOUND THEN
        IF bad.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'guard_agent_action: a new action starts PROPOSED or ADMITTED, not %',
                bad.state USING ERRCODE = 'check_violation';
        ELSIF bad.epoch <> 0 OR bad.attempt <> 0 THEN
            RAISE EXCEPTION 'guard_agent_action: a new action starts at epoch 0 and attempt 0'
                USING ERRCODE = 'check_violation';
        END IF;
        RAISE EXCEPTION 'guard_agent_action: kind % is not instance-level, workspace_id is required',
            bad.kind USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO agent_action_lane_intake (lane_key) SELECT DISTINCT n.lane_key FROM new_actions n;
    PERFORM pg_notify('outbox_' || current_schema(), '');
    RETURN NULL;
END;
$$;

-- A change of state or of a waiting action's due time (the triggers' WHEN clauses, 0004), or
-- the deletion of a live action.
CREATE OR REPLACE FUNCTION agent_action_lane_track() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- An erasure. A write that passed its fence may still be running: its lane stays held
        -- until the attempt's lease ends.
        INSERT INTO agent_action_lane_intake (lane_key, busy_until)
        VALUES (OLD.lane_key,
                CASE WHEN OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL
                     THEN OLD.lease_until END);
    ELSIF NEW.state = 'EXECUTING' OR OLD.state = 'EXECUTING' THEN
        PERFORM agent_action_lane_refresh(NEW.lane_key);
    ELSE
        INSERT INTO agent_action_lane_intake (lane_key) VALUES (NEW.lane_key);
    END IF;
    RETURN NULL;
END;
$$;

-- Folds up to p_limit intake rows into agent_action_lane; returns how many it folded. Lanes
-- without a row get one, set-based, with their head (a lane without a row has nothing
-- executing); lanes with a row are locked in lane_key order with SKIP LOCKED and refreshed one
-- by one; a lane whose row another transaction holds keeps its intake rows for the next call.
-- One intake at a time per schema (a try-lock: a second caller returns 0 at once), so two never
-- create the same lane's row and wait on each other.
CREATE FUNCTION agent_action_lane_intake(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch bigint[];
    keys text[];
    holds timestamptz[];
    fresh text[];
    folded text[] := '{}';
    lane record;
    n integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2831, hashtext(current_schema())) THEN
        RETURN 0;
    END IF;
    SELECT array_agg(i.seq) INTO batch
      FROM (SELECT seq FROM agent_action_lane_intake ORDER BY seq LIMIT p_limit) i;
    IF batch IS NULL THEN
        RETURN 0;
    END IF;
    SELECT array_agg(k.lane_key ORDER BY k.lane_key), array_agg(k.hold ORDER BY k.lane_key)
      INTO keys, holds
      FROM (SELECT i.lane_key, max(i.busy_until) AS hold
              FROM agent_action_lane_intake i
             WHERE i.seq = ANY (batch)
             GROUP BY i.lane_key) k;

    SELECT coalesce(array_agg(k.lane_key), '{}') INTO fresh
      FROM unnest(keys) AS k(lane_key)
     WHERE NOT EXISTS (SELECT 1 FROM agent_action_lane l WHERE l.lane_key = k.lane_key);
    INSERT INTO agent_action_lane (lane_key, head_id, head_kind, head_due_at)
    SELECT f.lane_key, h.id, h.kind, CASE WHEN h.state = 'ADMITTED' THEN h.available_at END
      FROM unnest(fresh) AS f(lane_key)
      JOIN LATERAL (SELECT a.id, a.kind, a.state, a.available_at
                      FROM agent_action a
                     WHERE a.lane_key = f.lane_key AND a.state IN ('PROPOSED', 'ADMITTED')
                     ORDER BY a.id
                     LIMIT 1) h ON true
     ORDER BY f.lane_key
    ON CONFLICT (lane_key) DO NOTHING;
    -- A lane whose actions all ended or were erased before this intake needs no row.
    folded := fresh;

    FOR lane IN
        SELECT l.lane_key, k.hold
          FROM agent_action_lane l
          JOIN unnest(keys, holds) AS k(lane_key, hold) ON k.lane_key = l.lane_key
         WHERE NOT (l.lane_key = ANY (fresh))
         ORDER BY l.lane_key
           FOR UPDATE OF l SKIP LOCKED
    LOOP
        IF lane.hold IS NOT NULL THEN
            UPDATE agent_action_lane
               SET busy_until = greatest(busy_until, lane.hold)
             WHERE lane_key = lane.lane_key;
        END IF;
        PERFORM agent_action_lane_refresh(lane.lane_key);
        folded := folded || lane.lane_key;
    END LOOP;

    DELETE FROM agent_action_lane_intake
     WHERE seq = ANY (batch) AND lane_key = ANY (folded);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- The guard as in 0001, but for attempts: a claim raises the epoch by one and leaves the
-- attempt as it is (a worker's take raises it), unless the claim is the take too (an
-- in-process executor runs what it claims: taken_epoch is the new epoch, the attempt one more).
-- Inserts are checked by agent_action_inserted.
CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ended constant text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    allowed boolean;
BEGIN
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

    -- A claim is the only change of epoch, and every claim raises it by one.
    IF NEW.epoch IS DISTINCT FROM OLD.epoch OR (NEW.state = 'EXECUTING' AND OLD.state <> 'EXECUTING') THEN
        IF NEW.state <> 'EXECUTING' OR NEW.epoch IS DISTINCT FROM OLD.epoch + 1 THEN
            RAISE EXCEPTION 'guard_agent_action: action % epoch % -> %: the epoch rises by exactly one, and only on a claim',
                OLD.id, OLD.epoch, NEW.epoch USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.attempt IS DISTINCT FROM OLD.attempt
           AND NOT (NEW.attempt = OLD.attempt + 1 AND NEW.taken_epoch IS NOT DISTINCT FROM NEW.epoch) THEN
            RAISE EXCEPTION 'guard_agent_action: action % attempt % -> %: a claim leaves the attempt as it is, unless it is also the take (then one more)',
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
