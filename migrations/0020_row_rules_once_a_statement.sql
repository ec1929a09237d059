-- 0020: an action's row rules are checked once a statement, over its transition tables.
--
-- PostgreSQL prepares a table's CHECK constraints, and a row trigger's WHEN clause, anew for
-- every statement that writes the table: it parses each one's stored expression tree from text
-- and plans it, before the first row. For agent_action's eleven checks (10 KB of expression
-- text) and the guard's WHEN clause (12 KB) that came to about 75 and 100 us of server time a
-- statement, whatever the rows: a single enqueue's INSERT paid the checks (0.30 against 0.21 ms
-- for the same insert into the same table without them), and every single-row UPDATE (a claim,
-- a fence, a finish of one action) paid both (0.49 against 0.23 ms without either). A plpgsql
-- trigger's queries are planned once a session instead, so:
--
-- - the eleven CHECK constraints become one rule, agent_action_broken_check(row), the name of
--   the first check a row breaks (the constraint names are kept, in the errors): the insert
--   trigger (agent_action_inserted) applies it to every inserted row, and the guard to every
--   updated one;
-- - the guard becomes an AFTER UPDATE statement trigger over the old and new versions paired
--   by id: one query finds the updates its row trigger's WHEN clause would have handed to the
--   function, and the function (agent_action_refuse_update, the row guard's checks and
--   messages unchanged) raises for the first of them it refuses. A statement that breaks a rule
--   fails as before, with check_violation and the same messages; nothing it wrote stays.
--
-- As with any trigger, the rules hold for every statement that fires triggers: a session with
-- session_replication_role = replica (logical replication's apply) skips them, as it always
-- skipped the guard. The change takes an ACCESS EXCLUSIVE lock on agent_action for a moment.

-- The name of the first rule a row of agent_action breaks, or NULL when it keeps them all: the
-- rules the table's CHECK constraints held until 0020, under their names. A SQL function that
-- PostgreSQL inlines into the triggers' cached plans (so it must stay a single SELECT with no
-- SET clause), and a row that is NULL (an update that changed an id) breaks none.
CREATE FUNCTION agent_action_broken_check(a agent_action) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN a.state NOT IN ('PROPOSED', 'ADMITTED', 'EXECUTING', 'DONE', 'UNCERTAIN', 'FAILED',
                             'CANCELLED') THEN 'ck_agent_action_state'
        WHEN a.lane_key = '' THEN 'ck_agent_action_lane_key'
        WHEN a.idempotency_key = '' THEN 'ck_agent_action_idempotency_key'
        WHEN a.max_attempts < 1 THEN 'ck_agent_action_max_attempts'
        WHEN a.attempt < 0 OR a.epoch < 0 THEN 'ck_agent_action_counters'
        -- An ended action has a stop reason and an end time, and keeps no payload; a live one
        -- is the opposite of all three.
        WHEN (a.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
             <> (a.stop_reason IS NOT NULL) THEN 'ck_agent_action_stop_reason'
        WHEN (a.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
             <> (a.ended_at IS NOT NULL) THEN 'ck_agent_action_ended_at'
        WHEN (a.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
             <> (a.payload IS NULL) THEN 'ck_agent_action_payload'
        -- A waiting action holds no lease and no fence: a retry clears both.
        WHEN a.state IN ('PROPOSED', 'ADMITTED')
             AND (a.lease_until IS NOT NULL OR a.write_started_at IS NOT NULL)
            THEN 'ck_agent_action_waiting_unfenced'
        WHEN a.state = 'EXECUTING' AND a.lease_until IS NULL
            THEN 'ck_agent_action_executing_leased'
        WHEN a.priority NOT BETWEEN -100 AND 100 THEN 'ck_agent_action_priority'
    END
$$;

-- Raises check_violation, as the constraint itself did, for a row that breaks a rule.
CREATE FUNCTION agent_action_refuse_broken(a agent_action) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    broken constant text := agent_action_broken_check(a);
BEGIN
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "agent_action" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', TABLE = 'agent_action', CONSTRAINT = broken,
                  DETAIL = format('Failing row: action %s (%s).', a.id, a.state);
    END IF;
END;
$$;

ALTER TABLE agent_action
    DROP CONSTRAINT ck_agent_action_state,
    DROP CONSTRAINT ck_agent_action_lane_key,
    DROP CONSTRAINT ck_agent_action_idempotency_key,
    DROP CONSTRAINT ck_agent_action_max_attempts,
    DROP CONSTRAINT ck_agent_action_counters,
    DROP CONSTRAINT ck_agent_action_stop_reason,
    DROP CONSTRAINT ck_agent_action_ended_at,
    DROP CONSTRAINT ck_agent_action_payload,
    DROP CONSTRAINT ck_agent_action_waiting_unfenced,
    DROP CONSTRAINT ck_agent_action_executing_leased,
    DROP CONSTRAINT ck_agent_action_priority;

-- 0015's insert trigger, with the row rules, and a path for a statement of one kind and one
-- lane (every single enqueue) that runs no query a plain expression can do: its first look at
-- the new rows is one aggregate (what a rule needs no lookup for, the kinds, the lanes), the
-- kind's lock and the wake-up are expressions, the kind one probe, the intake row one VALUES.
-- Each query of a trigger is set up anew (executor start) at every call, about a third of a
-- single enqueue's server time in the trigger went to setting up its three general queries.
CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch record;
    instance_level boolean;
    accepted boolean;
    bad record;
BEGIN
    SELECT count(*) AS actions, min(n.kind) AS kind, max(n.kind) AS last_kind,
           min(n.lane_key) AS lane_key, max(n.lane_key) AS last_lane_key,
           max(n.priority) AS priority, bool_or(n.workspace_id IS NULL) AS without_workspace,
           bool_or(n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
                   OR agent_action_broken_check(n) IS NOT NULL) AS broken
      INTO batch
      FROM new_actions n;
    IF batch.actions = 0 THEN
        RETURN NULL;
    END IF;
    IF batch.kind = batch.last_kind THEN
        PERFORM pg_advisory_xact_lock_shared(
                    hashtextextended('outbox kind ' || current_schema() || '.' || batch.kind, 0));
        PERFORM pg_notify('outbox_' || current_schema(), '');
        -- After the lock, so that the read sees what a deletion of the kind committed meanwhile.
        SELECT k.instance_level INTO instance_level
          FROM agent_action_kind k WHERE k.name = batch.kind;
        accepted := FOUND AND NOT batch.broken
                    AND (instance_level OR NOT batch.without_workspace);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(
                    hashtextextended('outbox kind ' || current_schema() || '.' || k.kind, 0)),
                pg_notify('outbox_' || current_schema(), '')
           FROM (SELECT DISTINCT n.kind FROM new_actions n ORDER BY n.kind) k;
        accepted := NOT batch.broken AND NOT EXISTS (
            SELECT 1 FROM new_actions n
              LEFT JOIN agent_action_kind k ON k.name = n.kind
             WHERE k.name IS NULL OR (n.workspace_id IS NULL AND NOT k.instance_level));
    END IF;
    IF NOT accepted THEN
        SELECT n.id, n.kind, n.state, n.epoch, n.attempt, k.name IS NOT NULL AS known INTO bad
          FROM new_actions n
          LEFT JOIN agent_action_kind k ON k.name = n.kind
         WHERE k.name IS NULL
            OR n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
            OR (n.workspace_id IS NULL AND NOT k.instance_level)
            OR agent_action_broken_check(n) IS NOT NULL
         ORDER BY k.name IS NULL DESC, n.id
         LIMIT 1;
        -- The row's rules first: the constraints ran before the trigger did.
        PERFORM agent_action_refuse_broken(a) FROM agent_action a WHERE a.id = bad.id;
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
    -- One intake row for the statement: its lane when it touched one, else all its lanes, the
    -- highest priority first (a fold that takes part of the row takes those first).
    IF batch.lane_key = batch.last_lane_key THEN
        INSERT INTO agent_action_lane_intake (lane_key, priority)
        VALUES (batch.lane_key, batch.priority);
    ELSE
        INSERT INTO agent_action_lane_intake (lane_keys, lanes, priority)
        SELECT array_agg(l.lane_key ORDER BY l.priority DESC), count(*), max(l.priority)
          FROM (SELECT n.lane_key, max(n.priority) AS priority
                  FROM new_actions n GROUP BY n.lane_key) l;
    END IF;
    RETURN NULL;
END;
$$;

-- The row guard's checks and messages (0001), for one update: `o` the row before, `n` after;
-- either is NULL when the update changed the id (the two versions no longer pair). Returns
-- when the update passes: a claim of a read-back action whose write started does.
CREATE FUNCTION agent_action_refuse_update(o agent_action, n agent_action) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    ended constant text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    allowed boolean;
BEGIN
    IF o.id IS NOT NULL AND o.state = ANY (ended) THEN
        RAISE EXCEPTION 'guard_agent_action: action % ended % and never changes', o.id, o.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF o.id IS NULL OR n.id IS NULL OR n.kind IS DISTINCT FROM o.kind
       OR n.lane_key IS DISTINCT FROM o.lane_key
       OR n.idempotency_key IS DISTINCT FROM o.idempotency_key
       OR n.workspace_id IS DISTINCT FROM o.workspace_id
       OR n.created_at IS DISTINCT FROM o.created_at THEN
        RAISE EXCEPTION 'guard_agent_action: id, kind, lane_key, idempotency_key, workspace_id and created_at of action % never change', coalesce(o.id, n.id)
            USING ERRCODE = 'check_violation';
    END IF;

    -- The transition table; outbox.state.ActionState carries the same one.
    allowed := CASE o.state
        WHEN 'PROPOSED' THEN n.state IN ('PROPOSED', 'ADMITTED', 'CANCELLED')
        WHEN 'ADMITTED' THEN n.state IN ('ADMITTED', 'EXECUTING', 'CANCELLED')
        WHEN 'EXECUTING' THEN n.state <> 'PROPOSED'
        ELSE false
    END;
    IF NOT allowed THEN
        RAISE EXCEPTION 'guard_agent_action: action % may not go from % to %', o.id, o.state, n.state
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim is the only change of epoch, and every claim raises it by one.
    IF n.epoch IS DISTINCT FROM o.epoch OR (n.state = 'EXECUTING' AND o.state <> 'EXECUTING') THEN
        IF n.state <> 'EXECUTING' OR n.epoch IS DISTINCT FROM o.epoch + 1 THEN
            RAISE EXCEPTION 'guard_agent_action: action % epoch % -> %: the epoch rises by exactly one, and only on a claim',
                o.id, o.epoch, n.epoch USING ERRCODE = 'check_violation';
        END IF;
        IF n.attempt IS DISTINCT FROM o.attempt
           AND NOT (n.attempt = o.attempt + 1 AND n.taken_epoch IS NOT DISTINCT FROM n.epoch) THEN
            RAISE EXCEPTION 'guard_agent_action: action % attempt % -> %: a claim leaves the attempt as it is, unless it is also the take (then one more)',
                o.id, o.attempt, n.attempt USING ERRCODE = 'check_violation';
        END IF;
        IF o.state = 'EXECUTING' AND o.write_started_at IS NOT NULL AND
           (SELECT k.at_most_once FROM agent_action_kind k WHERE k.name = o.kind) THEN
            RAISE EXCEPTION 'guard_agent_action: at-most-once action % started its write and is never claimed again', o.id
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    PERFORM agent_action_refuse_broken(n);
END;
$$;

DROP TRIGGER guard_agent_action ON agent_action;

-- The statement's updates that 0009's WHEN clause would have handed to the row guard (any
-- update it cannot pass without a lookup), or that break a row rule, in id order; the old and
-- new versions are paired by id (a FULL JOIN, so that a changed id shows as a version without
-- a partner). Any NULL along the way counts as suspect.
CREATE OR REPLACE FUNCTION guard_agent_action() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    suspect record;
BEGIN
    FOR suspect IN
        SELECT o::agent_action AS old_row, n::agent_action AS new_row
          FROM old_actions o
          FULL JOIN new_actions n ON n.id = o.id
         WHERE NOT coalesce(
                   o.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
                   AND (n.id, n.kind, n.lane_key, n.idempotency_key, n.workspace_id, n.created_at)
                       IS NOT DISTINCT FROM
                       (o.id, o.kind, o.lane_key, o.idempotency_key, o.workspace_id, o.created_at)
                   AND CASE o.state
                           WHEN 'PROPOSED' THEN n.state IN ('PROPOSED', 'ADMITTED', 'CANCELLED')
                           WHEN 'ADMITTED' THEN n.state IN ('ADMITTED', 'EXECUTING', 'CANCELLED')
                           ELSE n.state <> 'PROPOSED'
                       END
                   AND CASE WHEN n.epoch IS DISTINCT FROM o.epoch
                                 OR (n.state = 'EXECUTING' AND o.state <> 'EXECUTING')
                            THEN n.state = 'EXECUTING'
                                 AND n.epoch = o.epoch + 1
                                 AND (n.attempt = o.attempt
                                      OR (n.attempt = o.attempt + 1
                                          AND n.taken_epoch IS NOT DISTINCT FROM n.epoch))
                                 AND NOT (o.state = 'EXECUTING' AND o.write_started_at IS NOT NULL)
                            ELSE true
                       END,
                   false)
            OR agent_action_broken_check(n) IS NOT NULL
         ORDER BY coalesce(o.id, n.id)
    LOOP
        PERFORM agent_action_refuse_update(suspect.old_row, suspect.new_row);
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER guard_agent_action
    AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_actions NEW TABLE AS new_actions
    FOR EACH STATEMENT
    EXECUTE FUNCTION guard_agent_action();
