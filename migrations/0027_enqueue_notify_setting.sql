-- 0027: an insert's wake-up (its NOTIFY) can be turned off, per database, role or session.
--
-- Every transaction that enqueues sends one NOTIFY, so that an idle claimer claims at once
-- rather than at its next poll. PostgreSQL commits the transactions that notify one at a time:
-- each takes a lock (on "database 0") before its commit record and holds it until the record
-- is flushed, so that notifications reach listeners in commit order; such commits do not share
-- WAL flushes as other commits do. Where many application processes enqueue at once on a disk
-- whose flush is slow, that queue bounds how fast the application commits, and not only its
-- enqueues (docs/scaling.md, "Commits that notify").
--
-- The PostgreSQL setting outbox.enqueue_notify = off (ALTER DATABASE ... SET, ALTER ROLE ... SET,
-- a session's SET, or SET LOCAL in one transaction) leaves the NOTIFY out of the inserts it
-- covers; claimers then find those actions at their poll (OUTBOX_POLL_INTERVAL_SECONDS). Unset,
-- or any other value, the insert notifies as before. Nothing else changes: the kinds' check and
-- lock, the rules and the intake row are as in 0020.

-- Whether a value of outbox.enqueue_notify turns the NOTIFY off: only these spellings, in any
-- case (the trigger, and outbox status when it lists the roles and databases that set it).
CREATE FUNCTION agent_action_notify_off(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(lower(value) IN ('off', 'false', 'no', '0'), false)
$$;

CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch record;
    instance_level boolean;
    accepted boolean;
    bad record;
    -- Off only when the setting spells off: any other value (a typo included) keeps the
    -- wake-up, and never fails the application's insert.
    wake boolean := NOT agent_action_notify_off(current_setting('outbox.enqueue_notify', true));
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
        IF wake THEN
            PERFORM pg_notify('outbox_' || current_schema(), '');
        END IF;
        -- After the lock, so that the read sees what a deletion of the kind committed meanwhile.
        SELECT k.instance_level INTO instance_level
          FROM agent_action_kind k WHERE k.name = batch.kind;
        accepted := FOUND AND NOT batch.broken
                    AND (instance_level OR NOT batch.without_workspace);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(
                    hashtextextended('outbox kind ' || current_schema() || '.' || k.kind, 0))
           FROM (SELECT DISTINCT n.kind FROM new_actions n ORDER BY n.kind) k;
        IF wake THEN
            PERFORM pg_notify('outbox_' || current_schema(), '');
        END IF;
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
