-- 0009: the executor's batched updates pay the row triggers once a statement, not once a row.
--
-- A claim of 100 heads, and a group-committed finish of 100 attempts, called the guard and the
-- lane tracker (each a plpgsql call with its own search_path) once per row, and the tracker ran
-- the lane refresh's four queries per row: about two thirds of those statements' time
-- (docs/benchmarks.md). Now:
--
-- - the guard is called only for an update it may refuse: its WHEN clause passes, without a
--   function call, every update the function would let through without looking anything up
--   (a claim, a take, a fence, a finish, a retry); what it refuses, and how, is unchanged, as
--   the function is;
-- - the lanes an UPDATE statement moved are kept in step by one statement-level function over
--   its transition tables: lane rows locked in lane_key order, then refreshed set-based; a lane
--   left idle with a waiting head still goes through agent_action_lane_refresh (which decides
--   whether to wake the claimers), and a change that involves no executing action still only
--   appends to the lane intake (0005). A statement-level trigger has no WHEN clause, so a
--   fence's or a take's statement now calls the function too, which ends after one query over
--   the transition tables: one call a statement where a claim or a finish paid one a row.
--   Deletes (erasure) keep their row trigger;
-- - an insert checks its kinds once a statement in agent_action_inserted (one share lock a
--   kind), where the foreign key to agent_action_kind ran a trigger and a lookup a row: about a
--   quarter of an enqueue_many's server time. A kind that actions still name can be neither
--   deleted nor renamed, as before; the errors are the foreign key's.

DROP TRIGGER guard_agent_action ON agent_action;
-- The guard runs unless the update surely passes every one of its checks: the row has not
-- ended, no identity column changes, the transition is in the table, and an epoch change (or a
-- move into EXECUTING) is a claim that raises the epoch by one and leaves the attempt as it is
-- or, as the take too, raises it by one. A claim of a row whose write started needs the kind's
-- at_most_once (a lookup): the function decides. Any NULL along the way calls the function.
CREATE TRIGGER guard_agent_action
    BEFORE UPDATE ON agent_action
    FOR EACH ROW
    WHEN (NOT coalesce(
        OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
        AND (NEW.id, NEW.kind, NEW.lane_key, NEW.idempotency_key, NEW.workspace_id, NEW.created_at)
            IS NOT DISTINCT FROM
            (OLD.id, OLD.kind, OLD.lane_key, OLD.idempotency_key, OLD.workspace_id, OLD.created_at)
        AND CASE OLD.state
                WHEN 'PROPOSED' THEN NEW.state IN ('PROPOSED', 'ADMITTED', 'CANCELLED')
                WHEN 'ADMITTED' THEN NEW.state IN ('ADMITTED', 'EXECUTING', 'CANCELLED')
                ELSE NEW.state <> 'PROPOSED'
            END
        AND CASE WHEN NEW.epoch IS DISTINCT FROM OLD.epoch
                      OR (NEW.state = 'EXECUTING' AND OLD.state <> 'EXECUTING')
                 THEN NEW.state = 'EXECUTING'
                      AND NEW.epoch = OLD.epoch + 1
                      AND (NEW.attempt = OLD.attempt
                           OR (NEW.attempt = OLD.attempt + 1
                               AND NEW.taken_epoch IS NOT DISTINCT FROM NEW.epoch))
                      AND NOT (OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL)
                 ELSE true
            END,
        false))
    EXECUTE FUNCTION guard_agent_action();

-- The lanes an UPDATE statement moved (a change of state, or of a waiting action's due time), as
-- agent_action_lane_track did row by row (0005): a change that involves an executing action (a
-- claim, a finish, a retry, a deferral, a lost lease, a released claim) refreshes its lane now;
-- any other (an admit, a refusal, an expiry, a new due time) appends the lane to the intake.
CREATE FUNCTION agent_action_lanes_moved() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    keys text[];
    waiting text[];
    idle text[];
    locked integer;
BEGIN
    -- One plain query first: a fence's or a take's statement (nothing moved) ends here.
    SELECT array_agg(DISTINCT n.lane_key ORDER BY n.lane_key)
               FILTER (WHERE n.state = 'EXECUTING' OR o.state = 'EXECUTING'),
           array_agg(n.lane_key) FILTER (WHERE n.state <> 'EXECUTING' AND o.state <> 'EXECUTING')
      INTO keys, waiting
      FROM new_actions n
      JOIN old_actions o ON o.id = n.id
     WHERE n.state IS DISTINCT FROM o.state
        OR (n.state = 'ADMITTED' AND n.available_at IS DISTINCT FROM o.available_at);
    IF waiting IS NOT NULL THEN
        INSERT INTO agent_action_lane_intake (lane_key) SELECT unnest(waiting);
    END IF;
    IF keys IS NULL THEN
        RETURN NULL;
    END IF;

    -- The lane rows are locked first, in lane_key order, so two statements over the same lanes
    -- never wait on each other in a cycle; each query after the lock sees what committed.
    -- (Joined to unnest, not `= ANY (keys)`: that filter compared every lane row with every key.)
    SELECT count(*) INTO locked
      FROM (SELECT 1 FROM unnest(keys) AS k(lane_key)
              JOIN agent_action_lane l ON l.lane_key = k.lane_key
             ORDER BY l.lane_key
               FOR UPDATE OF l) x;
    IF locked < cardinality(keys) THEN
        -- A lane without a row (the outbox's own statements always find one): made, then locked.
        INSERT INTO agent_action_lane (lane_key)
        SELECT k FROM unnest(keys) AS k ORDER BY k
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM unnest(keys) AS k(lane_key)
          JOIN agent_action_lane l ON l.lane_key = k.lane_key
         ORDER BY l.lane_key
           FOR UPDATE OF l;
    END IF;

    -- Each lane's head (its smallest waiting action) and executing action, as
    -- agent_action_lane_refresh reads them; a lane with neither is dropped (or, held by an
    -- erased write, kept empty), a lane with an executing action is written here.
    WITH lane AS (
        SELECT k.lane_key, h.id AS head_id, h.kind AS head_kind,
               CASE WHEN h.state = 'ADMITTED' THEN h.available_at END AS head_due_at,
               coalesce(h.priority, 0) AS head_priority,
               coalesce(h.limit_key, '') AS head_limit_key,
               x.id AS executing_id
          FROM unnest(keys) AS k(lane_key)
          LEFT JOIN LATERAL (
                SELECT a.id, a.kind, a.state, a.available_at, a.priority,
                       coalesce(a.limit_key, a.workspace_id, '') AS limit_key
                  FROM agent_action a
                 WHERE a.lane_key = k.lane_key AND a.state IN ('PROPOSED', 'ADMITTED')
                 ORDER BY a.id
                 LIMIT 1) h ON true
          LEFT JOIN LATERAL (
                SELECT a.id FROM agent_action a
                 WHERE a.lane_key = k.lane_key AND a.state = 'EXECUTING'
                 LIMIT 1) x ON true
    ), dropped AS (
        DELETE FROM agent_action_lane l
         USING lane
         WHERE l.lane_key = lane.lane_key
           AND lane.head_id IS NULL AND lane.executing_id IS NULL
           AND (l.busy_until IS NULL OR l.busy_until <= now())
    ), held AS (
        UPDATE agent_action_lane l
           SET head_id = NULL, head_kind = NULL, head_due_at = NULL, executing_id = NULL
          FROM lane
         WHERE l.lane_key = lane.lane_key
           AND lane.head_id IS NULL AND lane.executing_id IS NULL
           AND l.busy_until > now()
    ), busy AS (
        UPDATE agent_action_lane l
           SET head_id = lane.head_id, head_kind = lane.head_kind,
               head_due_at = lane.head_due_at, executing_id = lane.executing_id,
               head_priority = lane.head_priority, head_limit_key = lane.head_limit_key
          FROM lane
         WHERE l.lane_key = lane.lane_key
           AND lane.executing_id IS NOT NULL
           AND (l.head_id, l.head_kind, l.head_due_at, l.executing_id, l.head_priority,
                l.head_limit_key) IS DISTINCT FROM
               (lane.head_id, lane.head_kind, lane.head_due_at, lane.executing_id,
                lane.head_priority, lane.head_limit_key)
    )
    SELECT array_agg(lane.lane_key ORDER BY lane.lane_key) INTO idle
      FROM lane
     WHERE lane.executing_id IS NULL AND lane.head_id IS NOT NULL;

    -- A lane left idle with a waiting head: the refresh writes it and wakes the claimers if
    -- the head is due (0004), as for a lane the intake folds.
    IF idle IS NOT NULL THEN
        PERFORM agent_action_lane_refresh(k) FROM unnest(idle) AS k ORDER BY k;
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER agent_action_lane_track ON agent_action;
CREATE TRIGGER agent_action_lanes_moved
    AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_actions NEW TABLE AS new_actions
    FOR EACH STATEMENT
    EXECUTE FUNCTION agent_action_lanes_moved();

-- The kinds of new actions: checked by agent_action_inserted, kept by agent_action_kind_in_use.
ALTER TABLE agent_action DROP CONSTRAINT agent_action_kind_fkey;

-- An insert, as in 0008, with the foreign key's check of the kinds in the same query as the
-- guard's: each distinct kind is locked against a deletion until this transaction ends (FOR KEY
-- SHARE, as the foreign key locked it for each row), and an action whose kind is not found (a
-- kind deleted before the lock is not) is refused first, as the foreign key's row triggers,
-- which ran before this statement-level one, refused it.
CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    bad record;
BEGIN
    SELECT n.id, n.kind, n.state, n.epoch, n.attempt, k.name IS NOT NULL AS known INTO bad
      FROM new_actions n
      LEFT JOIN (SELECT k.name, k.instance_level
                   FROM agent_action_kind k
                  WHERE k.name IN (SELECT n.kind FROM new_actions n)
                    FOR KEY SHARE OF k) k ON k.name = n.kind
     WHERE k.name IS NULL
        OR n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
        OR (n.workspace_id IS NULL AND NOT k.instance_level)
     ORDER BY k.name IS NULL DESC, n.id
     LIMIT 1;
    IF FOUND THEN
        IF NOT bad.known THEN
            RAISE EXCEPTION 'insert or update on table "agent_action" violates foreign key constraint "agent_action_kind_fkey"'
                USING ERRCODE = 'foreign_key_violation', TABLE = 'agent_action',
                      CONSTRAINT = 'agent_action_kind_fkey',
                      DETAIL = format('Key (kind)=(%s) is not present in table "agent_action_kind".',
                                      bad.kind);
        ELSIF bad.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'guard_agent_action: a new action starts PROPOSED or ADMITTED, not %',
                bad.state USING ERRCODE = 'check_violation';
        ELSIF bad.epoch <> 0 OR bad.attempt <> 0 THEN
            RAISE EXCEPTION 'guard_agent_action: a new action starts at epoch 0 and attempt 0'
                USING ERRCODE = 'check_violation';
        END IF;
        RAISE EXCEPTION 'guard_agent_action: kind % is not instance-level, workspace_id is required',
            bad.kind USING ERRCODE = 'check_violation';
    END IF;
    INSERT INTO agent_action_lane_intake (lane_key, priority)
    SELECT n.lane_key, max(n.priority) FROM new_actions n GROUP BY n.lane_key;
    PERFORM pg_notify('outbox_' || current_schema(), '');
    RETURN NULL;
END;
$$;

-- A kind that actions name is neither deleted nor renamed (what the foreign key refused). Its
-- row lock comes first (a BEFORE trigger runs once the row is locked), so an enqueue that holds
-- the kind has committed, and its actions are seen, before this looks.
CREATE FUNCTION agent_action_kind_in_use() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM agent_action a WHERE a.kind = OLD.name) THEN
        RAISE EXCEPTION 'update or delete on table "agent_action_kind" violates foreign key constraint "agent_action_kind_fkey" on table "agent_action"'
            USING ERRCODE = 'foreign_key_violation', TABLE = 'agent_action_kind',
                  CONSTRAINT = 'agent_action_kind_fkey',
                  DETAIL = format('Key (name)=(%s) is still referenced from table "agent_action".',
                                  OLD.name);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER agent_action_kind_in_use
    BEFORE DELETE ON agent_action_kind
    FOR EACH ROW EXECUTE FUNCTION agent_action_kind_in_use();
CREATE TRIGGER agent_action_kind_renamed
    BEFORE UPDATE ON agent_action_kind
    FOR EACH ROW WHEN (NEW.name IS DISTINCT FROM OLD.name)
    EXECUTE FUNCTION agent_action_kind_in_use();
