-- The outbox's schema as a fresh `outbox migrate` leaves it, for reading (not for applying:
-- migrations/ is what runs). Regenerate with `make schema`; tests/test_schema_snapshot.py fails
-- when this file and migrations/ disagree. The schema is shown as `outbox`, the default name.

-- schema outbox

CREATE SCHEMA outbox;

-- table agent_action

CREATE TABLE outbox.agent_action (
    id bigint NOT NULL,
    kind text NOT NULL COLLATE pg_catalog."C",
    state text DEFAULT 'ADMITTED'::text NOT NULL,
    workspace_id text COLLATE pg_catalog."C",
    lane_key text NOT NULL COLLATE pg_catalog."C",
    idempotency_key text NOT NULL COLLATE pg_catalog."C",
    payload jsonb,
    subject_account_id text COLLATE pg_catalog."C",
    max_attempts integer DEFAULT 5 NOT NULL,
    expires_at timestamp with time zone,
    attempt integer DEFAULT 0 NOT NULL,
    epoch bigint DEFAULT 0 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_until timestamp with time zone,
    write_started_at timestamp with time zone,
    readback_ref text,
    stop_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ended_at timestamp with time zone,
    taken_epoch bigint,
    retry_reason text,
    earlier_write_at timestamp with time zone,
    priority smallint DEFAULT 0 NOT NULL,
    limit_key text COLLATE pg_catalog."C",
    claimed_by text,
    taken_by text
)
WITH (fillfactor='70');
ALTER TABLE ONLY outbox.agent_action ALTER COLUMN payload SET COMPRESSION lz4;

-- function agent_action_broken_check(outbox.agent_action)

CREATE FUNCTION outbox.agent_action_broken_check(a outbox.agent_action) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
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

-- function agent_action_claim_round_state(integer, text[])

CREATE FUNCTION outbox.agent_action_claim_round_state(p_limit integer, p_kinds text[], OUT folded integer, OUT paused text[], OUT executing json, OUT waiting text[], OUT next_due_in double precision) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
BEGIN
    folded := agent_action_lane_intake(p_limit);
    SELECT (SELECT coalesce(array_agg(s.kind), '{}')
              FROM (SELECT p.kind FROM agent_action_kind_pause p
                    UNION
                    SELECT o.kind FROM agent_action_kind_outage o
                     WHERE o.held_until > now()) s),
           (SELECT coalesce(json_agg(e), '[]')
              FROM (SELECT a.kind,
                           count(*) FILTER (WHERE a.lease_until > now()) AS n,
                           count(*) FILTER (WHERE a.lease_until <= now()
                                              AND a.taken_epoch IS DISTINCT FROM a.epoch)
                               AS unconsumed,
                           count(*) FILTER (WHERE a.lease_until <= now()) AS expired
                      FROM agent_action a
                     WHERE a.state = 'EXECUTING'
                     GROUP BY a.kind) e),
           agent_action_kinds_waiting(p_kinds),
           -- One probe of ix_agent_action_lane_scheduled_kind a kind: its first entry.
           (SELECT extract(epoch FROM min(n.due) - clock_timestamp())::double precision
              FROM unnest(p_kinds) AS k(kind)
             CROSS JOIN LATERAL (
                   SELECT s.head_due_at AS due
                     FROM agent_action_lane s
                    WHERE s.head_scheduled AND s.head_kind = k.kind
                    ORDER BY s.head_due_at
                    LIMIT 1) n)
      INTO paused, executing, waiting, next_due_in;
END;
$$;

-- function agent_action_inserted()

CREATE FUNCTION outbox.agent_action_inserted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
                   OR outbox.agent_action_broken_check(n) IS NOT NULL) AS broken,
           CASE WHEN min(n.kind) = max(n.kind) THEN
               pg_advisory_xact_lock_shared(
                   hashtextextended('outbox kind ' || 'outbox' || '.' || min(n.kind), 0))
           END AS kind_locked,
           -- Off only when the setting spells off: any other value (a typo included) keeps
           -- the wake-up, and never fails the application's insert.
           CASE WHEN count(*) > 0 AND NOT outbox.agent_action_notify_off(
                                              current_setting('outbox.enqueue_notify', true))
               THEN pg_notify('outbox_' || 'outbox', '')
           END AS woke
      INTO batch
      FROM new_actions n;
    IF batch.actions = 0 THEN
        RETURN NULL;
    END IF;
    IF batch.kind = batch.last_kind AND batch.lane_key = batch.last_lane_key
       AND NOT batch.broken THEN
        INSERT INTO outbox.agent_action_lane_intake (lane_key, priority)
        SELECT batch.lane_key, batch.priority
          FROM outbox.agent_action_kind k
         WHERE k.name = batch.kind AND (k.instance_level OR NOT batch.without_workspace);
        IF FOUND THEN
            RETURN NULL;
        END IF;
        accepted := false;
    ELSIF batch.kind = batch.last_kind THEN
        SELECT k.instance_level INTO instance_level
          FROM outbox.agent_action_kind k WHERE k.name = batch.kind;
        accepted := FOUND AND NOT batch.broken
                    AND (instance_level OR NOT batch.without_workspace);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(
                    hashtextextended('outbox kind ' || 'outbox' || '.' || k.kind, 0))
           FROM (SELECT DISTINCT n.kind FROM new_actions n ORDER BY n.kind) k;
        accepted := NOT batch.broken AND NOT EXISTS (
            SELECT 1 FROM new_actions n
              LEFT JOIN outbox.agent_action_kind k ON k.name = n.kind
             WHERE k.name IS NULL OR (n.workspace_id IS NULL AND NOT k.instance_level));
    END IF;
    IF NOT accepted THEN
        SELECT n.id, n.kind, n.state, n.epoch, n.attempt, k.name IS NOT NULL AS known INTO bad
          FROM new_actions n
          LEFT JOIN outbox.agent_action_kind k ON k.name = n.kind
         WHERE k.name IS NULL
            OR n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
            OR (n.workspace_id IS NULL AND NOT k.instance_level)
            OR outbox.agent_action_broken_check(n) IS NOT NULL
         ORDER BY k.name IS NULL DESC, n.id
         LIMIT 1;
        -- The row's rules first: the constraints ran before the trigger did.
        PERFORM outbox.agent_action_refuse_broken(a)
           FROM outbox.agent_action a WHERE a.id = bad.id;
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
        INSERT INTO outbox.agent_action_lane_intake (lane_key, priority)
        VALUES (batch.lane_key, batch.priority);
    ELSE
        INSERT INTO outbox.agent_action_lane_intake (lane_keys, lanes, priority)
        SELECT array_agg(l.lane_key ORDER BY l.priority DESC), count(*), max(l.priority)
          FROM (SELECT n.lane_key, max(n.priority) AS priority
                  FROM new_actions n GROUP BY n.lane_key) l;
    END IF;
    RETURN NULL;
END;
$$;

-- function agent_action_kind_in_use()

CREATE FUNCTION outbox.agent_action_kind_in_use() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('outbox kind ' || current_schema() || '.' || OLD.name, 0));
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

-- function agent_action_kinds_waiting(text[])

CREATE FUNCTION outbox.agent_action_kinds_waiting(p_kinds text[]) RETURNS text[]
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    -- One probe of ix_agent_action_lane_ready a kind: a head that is due, or was scheduled
    -- and has come due since the fold promoted (OFFSET 0: a probe a kind, not a semi-join over
    -- the lane table).
    RETURN (SELECT coalesce(array_agg(k.kind), '{}')
              FROM unnest(p_kinds) AS k(kind)
             WHERE EXISTS (SELECT 1 FROM agent_action_lane l
                            WHERE l.head_kind = k.kind
                              AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                              AND NOT l.head_scheduled
                           OFFSET 0));
END;
$$;

-- function agent_action_lane_intake(integer)

CREATE FUNCTION outbox.agent_action_lane_intake(p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    tids tid[];
    takes integer[];
    keys text[];
    holds timestamptz[];
    fresh text[];
    fresh_holds timestamptz[];
    existing text[];
    existing_holds timestamptz[];
    folded text[];
    taken integer;
    lane record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2831, hashtext(current_schema())) THEN
        RETURN 0;
    END IF;
    -- The rows this fold takes from (by tuple id: no other transaction changes an intake row
    -- while this one holds the fold's lock), and how many of each row's lanes (a prefix), as
    -- in 0015.
    SELECT array_agg(t.tid), array_agg(t.take), sum(t.take) INTO tids, takes, taken
      FROM (SELECT p.tid, max(p.take)::integer AS take
              FROM (SELECT w.tid, least(w.lanes, p_limit - w.before) AS take
                      FROM (SELECT i.tid, i.lanes,
                                   sum(i.lanes) OVER (ORDER BY i.priority DESC, i.seq
                                                      ROWS UNBOUNDED PRECEDING) - i.lanes
                                       AS before
                              FROM (SELECT ctid AS tid, seq, priority, lanes
                                      FROM agent_action_lane_intake
                                     ORDER BY priority DESC, seq LIMIT p_limit) i) w
                     WHERE w.before < p_limit
                    UNION ALL
                    SELECT r.tid, least(r.lanes, 64)
                      FROM (SELECT ctid AS tid, lanes FROM agent_action_lane_intake
                             ORDER BY seq DESC LIMIT 64) r) p
             GROUP BY p.tid) t;
    IF tids IS NULL THEN
        RETURN agent_action_lane_promote(p_limit);
    END IF;
    SELECT array_agg(k.lane_key ORDER BY k.lane_key), array_agg(k.hold ORDER BY k.lane_key)
      INTO keys, holds
      FROM (SELECT u.lane_key, max(i.busy_until) AS hold
              FROM unnest(tids, takes) AS b(tid, take)
             CROSS JOIN LATERAL (
                   SELECT x.lane_key, x.lane_keys, x.busy_until
                     FROM agent_action_lane_intake x
                    WHERE x.ctid = b.tid
                   OFFSET 0) i
             CROSS JOIN LATERAL
                   unnest(coalesce(i.lane_keys[1:b.take], ARRAY[i.lane_key])) AS u(lane_key)
             GROUP BY u.lane_key) k;

    -- Which lanes have a row (refreshed below) and which are fresh (made here), one index
    -- probe a lane.
    SELECT coalesce(array_agg(k.lane_key ORDER BY k.lane_key) FILTER (WHERE l.found IS NULL),
                    '{}'),
           coalesce(array_agg(k.hold ORDER BY k.lane_key) FILTER (WHERE l.found IS NULL), '{}'),
           coalesce(array_agg(k.lane_key ORDER BY k.lane_key) FILTER (WHERE l.found), '{}'),
           coalesce(array_agg(k.hold ORDER BY k.lane_key) FILTER (WHERE l.found), '{}')
      INTO fresh, fresh_holds, existing, existing_holds
      FROM unnest(keys, holds) AS k(lane_key, hold)
      LEFT JOIN LATERAL (
            SELECT true AS found FROM agent_action_lane l
             WHERE l.lane_key = k.lane_key
            OFFSET 0) l ON true;

    -- A fresh lane gets a row when an action of it waits (its head), or when an erased write
    -- holds it; the row names the lane's executing action, locked so that it cannot end before
    -- this row commits (its finish then finds the row). A lane whose executing action another
    -- transaction holds is left in the intake; so is a lane whose row another transaction
    -- made meanwhile (the next fold refreshes that row, with this lane's hold). A lane with
    -- nothing waiting and no hold needs no row and is folded.
    WITH probe AS (
        SELECT f.lane_key, f.hold, h.id, h.kind, h.state, h.available_at, h.priority,
               h.limit_key, x.id AS executing_id, y.id AS locked_id
          FROM unnest(fresh, fresh_holds) AS f(lane_key, hold)
          LEFT JOIN LATERAL (
                SELECT a.id, a.kind, a.state, a.available_at, a.priority,
                       coalesce(a.limit_key, a.workspace_id, '') AS limit_key
                  FROM agent_action a
                 WHERE a.lane_key = f.lane_key AND a.state IN ('PROPOSED', 'ADMITTED')
                 ORDER BY a.id
                 LIMIT 1) h ON true
          LEFT JOIN LATERAL (
                SELECT a.id FROM agent_action a
                 WHERE a.lane_key = f.lane_key AND a.state = 'EXECUTING'
                 LIMIT 1) x ON h.id IS NOT NULL  -- a probe a lane: never a join over them all
          LEFT JOIN LATERAL (
                SELECT a.id FROM agent_action a
                 WHERE a.id = x.id AND a.state = 'EXECUTING'
                   FOR SHARE OF a SKIP LOCKED) y ON true
    ), made AS (
        INSERT INTO agent_action_lane
            (lane_key, head_id, head_kind, head_due_at, head_scheduled, head_priority,
             head_limit_key, executing_id, busy_until)
        SELECT p.lane_key, p.id, p.kind, CASE WHEN p.state = 'ADMITTED' THEN p.available_at END,
               coalesce(p.state = 'ADMITTED' AND p.available_at > now(), false),
               coalesce(p.priority, 0), coalesce(p.limit_key, ''), p.executing_id,
               CASE WHEN p.hold > now() THEN p.hold END
          FROM probe p
         WHERE (p.id IS NOT NULL OR p.hold > now())
           AND (p.executing_id IS NULL OR p.locked_id IS NOT NULL)
         ORDER BY p.lane_key
        ON CONFLICT (lane_key) DO NOTHING
        RETURNING lane_key
    )
    -- Two arrays joined end to end, not a join of the two (a generic plan's guess of their
    -- sizes could make that a nested loop).
    SELECT (SELECT coalesce(array_agg(m.lane_key), '{}') FROM made m)
           || (SELECT coalesce(array_agg(p.lane_key), '{}') FROM probe p
                WHERE p.id IS NULL AND (p.hold IS NULL OR p.hold <= now()))
      INTO folded;

    -- The lanes that had a row, locked in lane_key order (the order of existing), skipping a
    -- row another transaction holds (its lane stays in the intake).
    FOR lane IN
        SELECT k.lane_key, k.hold
          FROM unnest(existing, existing_holds) AS k(lane_key, hold)
         CROSS JOIN LATERAL (
               SELECT 1 FROM agent_action_lane l
                WHERE l.lane_key = k.lane_key
                  FOR UPDATE OF l SKIP LOCKED) l
    LOOP
        IF lane.hold IS NOT NULL THEN
            UPDATE agent_action_lane
               SET busy_until = greatest(busy_until, lane.hold)
             WHERE lane_key = lane.lane_key;
        END IF;
        PERFORM agent_action_lane_refresh(lane.lane_key);
        folded := folded || lane.lane_key;
    END LOOP;

    IF cardinality(folded) = cardinality(keys) THEN
        -- Every lane taken was folded: a row taken whole leaves, a row taken in part keeps the
        -- lanes after its prefix.
        DELETE FROM agent_action_lane_intake i
         USING unnest(tids, takes) AS b(tid, take)
         WHERE i.ctid = b.tid AND i.lanes <= b.take;
        UPDATE agent_action_lane_intake i
           SET lane_keys = i.lane_keys[b.take + 1:], lanes = i.lanes - b.take
          FROM unnest(tids, takes) AS b(tid, take)
         WHERE i.ctid = b.tid AND i.lanes > b.take;
        RETURN taken + agent_action_lane_promote(p_limit);
    END IF;
    taken := agent_action_lane_intake_held(tids, takes, keys, folded, taken);
    RETURN taken + agent_action_lane_promote(p_limit);
END;
$$;

-- function agent_action_lane_intake_held(tid[], integer[], text[], text[], integer)

CREATE FUNCTION outbox.agent_action_lane_intake_held(tids tid[], takes integer[], keys text[], folded text[], taken integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    SET plan_cache_mode TO 'auto'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    skipped text[];
    emptied tid[];
BEGIN
    SELECT array_agg(k.lane_key) INTO skipped
      FROM unnest(keys) AS k(lane_key)
     WHERE NOT EXISTS (SELECT 1 FROM unnest(folded) AS f(lane_key) WHERE f.lane_key = k.lane_key);
    WITH kept AS (
        UPDATE agent_action_lane_intake i
           SET lane_keys = coalesce(h.held, '{}') || i.lane_keys[b.take + 1:],
               lanes = coalesce(cardinality(h.held), 0) + i.lanes - b.take
          FROM unnest(tids, takes) AS b(tid, take)
          LEFT JOIN (SELECT c.tid, array_agg(u.lane_key ORDER BY u.n) AS held
                       FROM unnest(tids, takes) AS c(tid, take)
                      CROSS JOIN LATERAL (
                            SELECT x.lane_keys FROM agent_action_lane_intake x
                             WHERE x.ctid = c.tid
                            OFFSET 0) x
                      CROSS JOIN LATERAL
                            unnest(x.lane_keys[1:c.take]) WITH ORDINALITY AS u(lane_key, n)
                       JOIN unnest(skipped) AS s(lane_key) ON s.lane_key = u.lane_key
                      GROUP BY c.tid) h ON h.tid = b.tid
         WHERE i.ctid = b.tid AND i.lane_keys IS NOT NULL
        RETURNING i.ctid AS tid, i.lanes, coalesce(cardinality(h.held), 0) AS held)
    SELECT taken - coalesce(sum(kept.held), 0),
           coalesce(array_agg(kept.tid) FILTER (WHERE kept.lanes = 0), '{}')
      INTO taken, emptied
      FROM kept;
    -- A rewritten row's old tuple id finds nothing now; its new one (emptied) finds it.
    DELETE FROM agent_action_lane_intake i
     USING unnest(tids || emptied) AS b(tid)
     WHERE i.ctid = b.tid
       AND (i.lanes = 0
            OR (i.lane_keys IS NULL
                AND NOT EXISTS (SELECT 1 FROM unnest(skipped) AS s(lane_key)
                                 WHERE s.lane_key = i.lane_key)));
    -- The single rows of the batch left are the held ones.
    RETURN taken - (SELECT count(*)::integer
                      FROM unnest(tids) AS b(tid)
                     CROSS JOIN LATERAL (
                           SELECT 1 FROM agent_action_lane_intake i
                            WHERE i.ctid = b.tid AND i.lane_keys IS NULL
                           OFFSET 0) i);
END;
$$;

-- function agent_action_lane_promote(integer)

CREATE FUNCTION outbox.agent_action_lane_promote(p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    promoted integer;
BEGIN
    -- By tuple id (a TID scan), which the locking probe read, as the other lane functions
    -- write (0023): joined by lane key, a generic plan scanned the whole lane table.
    UPDATE agent_action_lane l
       SET head_scheduled = false
     WHERE l.ctid = ANY (ARRAY(
               SELECT s.ctid
                 FROM agent_action_lane s
                WHERE s.head_scheduled AND s.head_due_at <= now()
                ORDER BY s.head_due_at
                LIMIT p_limit
                  FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS promoted = ROW_COUNT;
    RETURN promoted;
END;
$$;

-- function agent_action_lane_refresh(text)

CREATE FUNCTION outbox.agent_action_lane_refresh(p_lane text) RETURNS void
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    head record;
    executing bigint;
BEGIN
    PERFORM 1 FROM agent_action_lane WHERE lane_key = p_lane FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_action_lane (lane_key) VALUES (p_lane) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_action_lane WHERE lane_key = p_lane FOR UPDATE;
    END IF;
    SELECT a.id, a.kind, a.state, a.available_at, a.priority,
           coalesce(a.limit_key, a.workspace_id, '') AS limit_key INTO head
      FROM agent_action a
     WHERE a.lane_key = p_lane AND a.state IN ('PROPOSED', 'ADMITTED')
     ORDER BY a.id LIMIT 1;
    SELECT a.id INTO executing FROM agent_action a WHERE a.lane_key = p_lane AND a.state = 'EXECUTING';
    IF head.id IS NULL THEN
        DELETE FROM agent_action_lane
         WHERE lane_key = p_lane AND (busy_until IS NULL OR busy_until <= now());
        IF NOT FOUND THEN  -- held by an erased write: keep the row, with no head
            UPDATE agent_action_lane
               SET head_id = NULL, head_kind = NULL, head_due_at = NULL, head_scheduled = false,
                   executing_id = executing
             WHERE lane_key = p_lane;
        END IF;
    ELSE
        UPDATE agent_action_lane l
           SET head_id = head.id,
               head_kind = head.kind,
               head_due_at = CASE WHEN head.state = 'ADMITTED' THEN head.available_at END,
               head_scheduled = head.state = 'ADMITTED' AND head.available_at > now(),
               executing_id = executing,
               head_priority = coalesce(head.priority, 0),
               head_limit_key = coalesce(head.limit_key, '')
         WHERE l.lane_key = p_lane
           AND (l.head_id, l.head_kind, l.head_due_at, l.head_scheduled, l.executing_id,
                l.head_priority, l.head_limit_key) IS DISTINCT FROM
               (head.id, head.kind, CASE WHEN head.state = 'ADMITTED' THEN head.available_at END,
                head.state = 'ADMITTED' AND head.available_at > now(),
                executing, coalesce(head.priority, 0), coalesce(head.limit_key, ''));
        IF executing IS NULL AND head.state = 'ADMITTED' AND head.available_at <= now() THEN
            PERFORM pg_notify('outbox_' || current_schema(), '');
        END IF;
    END IF;
END;
$$;

-- function agent_action_lane_track()

CREATE FUNCTION outbox.agent_action_lane_track() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    AS $$
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

-- function agent_action_lanes_moved()

CREATE FUNCTION outbox.agent_action_lanes_moved() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    SET plan_cache_mode TO 'force_generic_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    keys text[];
    waiting text[];
    idle text[];
    locked integer;
    made integer;
BEGIN
    -- A take's, a fence's or a reclaim's statement (every row EXECUTING before and after)
    -- moved no lane and ends here: two scans that each stop at the first row of another state.
    IF NOT EXISTS (SELECT 1 FROM new_actions n WHERE n.state <> 'EXECUTING')
       AND NOT EXISTS (SELECT 1 FROM old_actions o WHERE o.state <> 'EXECUTING') THEN
        RETURN NULL;
    END IF;
    -- Each row's old and new version are paired by grouping both tables on the id, not by a
    -- join (0014).
    SELECT array_agg(DISTINCT m.lane_key ORDER BY m.lane_key)
               FILTER (WHERE m.new_state = 'EXECUTING' OR m.old_state = 'EXECUTING'),
           array_agg(m.lane_key)
               FILTER (WHERE m.new_state <> 'EXECUTING' AND m.old_state <> 'EXECUTING')
      INTO keys, waiting
      FROM (SELECT max(v.lane_key) FILTER (WHERE v.new) AS lane_key,
                   max(v.state) FILTER (WHERE v.new) AS new_state,
                   max(v.state) FILTER (WHERE NOT v.new) AS old_state,
                   max(v.available_at) FILTER (WHERE v.new) AS new_due,
                   max(v.available_at) FILTER (WHERE NOT v.new) AS old_due
              FROM (SELECT n.id, n.lane_key, n.state, n.available_at, true AS new
                      FROM new_actions n
                    UNION ALL
                    SELECT o.id, o.lane_key, o.state, o.available_at, false
                      FROM old_actions o) v
             GROUP BY v.id) m
     WHERE m.new_state IS DISTINCT FROM m.old_state
        OR (m.new_state = 'ADMITTED' AND m.new_due IS DISTINCT FROM m.old_due);
    IF waiting IS NOT NULL THEN
        INSERT INTO agent_action_lane_intake (lane_key) SELECT unnest(waiting);
    END IF;
    IF keys IS NULL THEN
        RETURN NULL;
    END IF;

    -- The lane rows are locked first, in lane_key order (the order of keys, which the probes
    -- follow), so two statements over the same lanes never wait on each other in a cycle; each
    -- query after the lock sees what committed.
    SELECT count(*) INTO locked
      FROM unnest(keys) AS k(lane_key)
     CROSS JOIN LATERAL (
           SELECT 1 FROM agent_action_lane l
            WHERE l.lane_key = k.lane_key
              FOR UPDATE OF l) x;
    IF locked < cardinality(keys) THEN
        -- A lane without a row (a finish's lane whose action ran alone, usually) gets one only
        -- if an action of it waits: one probe of ix_agent_action_lane_waiting a lane. Made as
        -- the fold makes one, then locked with the others.
        INSERT INTO agent_action_lane
            (lane_key, head_id, head_kind, head_due_at, head_scheduled, head_priority,
             head_limit_key, executing_id)
        SELECT k.lane_key, h.id, h.kind, CASE WHEN h.state = 'ADMITTED' THEN h.available_at END,
               coalesce(h.state = 'ADMITTED' AND h.available_at > now(), false),
               coalesce(h.priority, 0), h.limit_key,
               (SELECT a.id FROM agent_action a
                 WHERE a.lane_key = k.lane_key AND a.state = 'EXECUTING')
          FROM unnest(keys) AS k(lane_key)
          JOIN LATERAL (
                SELECT a.id, a.kind, a.state, a.available_at, a.priority,
                       coalesce(a.limit_key, a.workspace_id, '') AS limit_key
                  FROM agent_action a
                 WHERE a.lane_key = k.lane_key AND a.state IN ('PROPOSED', 'ADMITTED')
                 ORDER BY a.id
                 LIMIT 1) h ON true
         -- OFFSET 0 keeps the test a probe a lane (not an anti-join over the lane table).
         WHERE NOT EXISTS (SELECT 1 FROM agent_action_lane l WHERE l.lane_key = k.lane_key
                           OFFSET 0)
         ORDER BY k.lane_key
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS made = ROW_COUNT;
        IF locked = 0 AND made = 0 THEN
            RETURN NULL;
        END IF;
        PERFORM 1
           FROM unnest(keys) AS k(lane_key)
          CROSS JOIN LATERAL (
                SELECT 1 FROM agent_action_lane l
                 WHERE l.lane_key = k.lane_key
                   FOR UPDATE OF l) x;
    END IF;

    -- Each locked lane's head (its smallest waiting action) and executing action, as
    -- agent_action_lane_refresh reads them; a lane with no head is dropped (or, held by an
    -- erased write, kept with no head), a lane with an executing action is written here. A lane
    -- still without a row had nothing waiting a statement ago; what waits in it now is in the
    -- intake, for the next fold.
    WITH lane AS (
        SELECT k.lane_key, r.tid, h.id AS head_id, h.kind AS head_kind,
               CASE WHEN h.state = 'ADMITTED' THEN h.available_at END AS head_due_at,
               coalesce(h.state = 'ADMITTED' AND h.available_at > now(), false)
                   AS head_scheduled,
               coalesce(h.priority, 0) AS head_priority,
               coalesce(h.limit_key, '') AS head_limit_key,
               x.id AS executing_id
          FROM unnest(keys) AS k(lane_key)
         CROSS JOIN LATERAL (
               SELECT r.ctid AS tid FROM agent_action_lane r
                WHERE r.lane_key = k.lane_key
               OFFSET 0) r
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
         WHERE l.ctid = lane.tid
           AND lane.head_id IS NULL
           AND (l.busy_until IS NULL OR l.busy_until <= now())
    ), held AS (
        UPDATE agent_action_lane l
           SET head_id = NULL, head_kind = NULL, head_due_at = NULL, head_scheduled = false,
               executing_id = lane.executing_id
          FROM lane
         WHERE l.ctid = lane.tid
           AND lane.head_id IS NULL
           AND l.busy_until > now()
    ), busy AS (
        UPDATE agent_action_lane l
           SET head_id = lane.head_id, head_kind = lane.head_kind,
               head_due_at = lane.head_due_at, head_scheduled = lane.head_scheduled,
               executing_id = lane.executing_id,
               head_priority = lane.head_priority, head_limit_key = lane.head_limit_key
          FROM lane
         WHERE l.ctid = lane.tid
           AND lane.executing_id IS NOT NULL AND lane.head_id IS NOT NULL
           AND (l.head_id, l.head_kind, l.head_due_at, l.head_scheduled, l.executing_id,
                l.head_priority, l.head_limit_key) IS DISTINCT FROM
               (lane.head_id, lane.head_kind, lane.head_due_at, lane.head_scheduled,
                lane.executing_id, lane.head_priority, lane.head_limit_key)
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

-- function agent_action_notify_off(text)

CREATE FUNCTION outbox.agent_action_notify_off(value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT coalesce(lower(value) IN ('off', 'false', 'no', '0'), false)
$$;

-- function agent_action_refuse_broken(outbox.agent_action)

CREATE FUNCTION outbox.agent_action_refuse_broken(a outbox.agent_action) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    AS $$
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

-- function agent_action_refuse_update(outbox.agent_action, outbox.agent_action)

CREATE FUNCTION outbox.agent_action_refuse_update(o outbox.agent_action, n outbox.agent_action) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    AS $$
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

-- function guard_agent_action()

CREATE FUNCTION outbox.guard_agent_action() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'outbox'
    AS $$
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

-- function outbox_claimer_may_judge(text, interval, interval)

CREATE FUNCTION outbox.outbox_claimer_may_judge(p_claimer text, p_silent interval, p_gap interval) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'outbox'
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM outbox_process
         WHERE process_id = p_claimer
           AND last_seen >= now() - p_gap
           AND beating_since <= now() - p_silent)
$$;

-- table agent_action_attempt

CREATE TABLE outbox.agent_action_attempt (
    action_id bigint NOT NULL,
    epoch bigint NOT NULL,
    attempt integer NOT NULL,
    claimed_at timestamp with time zone NOT NULL,
    taken_at timestamp with time zone NOT NULL,
    fence_passed_at timestamp with time zone,
    ended_at timestamp with time zone,
    result text,
    reason text,
    provider_ref text,
    error_class text
)
WITH (fillfactor='50');

-- sequence agent_action_id_seq

ALTER TABLE outbox.agent_action ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.agent_action_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table agent_action_kind

CREATE TABLE outbox.agent_action_kind (
    name text NOT NULL COLLATE pg_catalog."C",
    at_most_once boolean NOT NULL,
    instance_level boolean NOT NULL,
    declared_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT agent_action_kind_name_check CHECK ((name ~ '^[A-Z][A-Z0-9_]{0,62}$'::text))
);

-- table agent_action_kind_outage

CREATE TABLE outbox.agent_action_kind_outage (
    kind text NOT NULL COLLATE pg_catalog."C",
    since timestamp with time zone,
    retried bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    held_until timestamp with time zone,
    holds integer DEFAULT 0 NOT NULL,
    CONSTRAINT agent_action_kind_outage_check CHECK (((since IS NULL) = (cardinality(retried) = 0)))
);

-- table agent_action_kind_pause

CREATE TABLE outbox.agent_action_kind_pause (
    kind text NOT NULL COLLATE pg_catalog."C",
    paused_by text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    note text
);

-- table agent_action_lane

CREATE TABLE outbox.agent_action_lane (
    lane_key text NOT NULL COLLATE pg_catalog."C",
    head_id bigint,
    head_kind text COLLATE pg_catalog."C",
    head_due_at timestamp with time zone,
    executing_id bigint,
    busy_until timestamp with time zone,
    head_priority smallint DEFAULT 0 NOT NULL,
    head_limit_key text DEFAULT ''::text NOT NULL COLLATE pg_catalog."C",
    head_scheduled boolean DEFAULT false NOT NULL
);

-- table agent_action_lane_intake

CREATE TABLE outbox.agent_action_lane_intake (
    seq bigint NOT NULL,
    lane_key text COLLATE pg_catalog."C",
    busy_until timestamp with time zone,
    priority smallint DEFAULT 0 NOT NULL,
    lane_keys text[] COLLATE pg_catalog."C",
    lanes integer DEFAULT 1 NOT NULL,
    CONSTRAINT ck_agent_action_lane_intake_lanes CHECK (((lane_key IS NULL) <> (lane_keys IS NULL)))
);

-- sequence agent_action_lane_intake_seq_seq

ALTER TABLE outbox.agent_action_lane_intake ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.agent_action_lane_intake_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table agent_action_link

CREATE TABLE outbox.agent_action_link (
    from_id bigint NOT NULL,
    to_id bigint NOT NULL,
    relation text NOT NULL,
    created_by text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT agent_action_link_relation_check CHECK ((relation = ANY (ARRAY['RESEND'::text, 'RETRY'::text])))
);

-- table agent_action_parked_payload

CREATE TABLE outbox.agent_action_parked_payload (
    action_id bigint NOT NULL,
    payload jsonb NOT NULL,
    parked_at timestamp with time zone DEFAULT now() NOT NULL
);

-- table agent_action_rate

CREATE TABLE outbox.agent_action_rate (
    bucket text NOT NULL COLLATE pg_catalog."C",
    next_at timestamp with time zone DEFAULT '-infinity'::timestamp with time zone NOT NULL,
    held_until timestamp with time zone,
    used_at timestamp with time zone DEFAULT now() NOT NULL
);

-- table agent_action_resolution

CREATE TABLE outbox.agent_action_resolution (
    action_id bigint NOT NULL,
    outcome text NOT NULL,
    note text,
    resolved_by text NOT NULL,
    resolved_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT agent_action_resolution_outcome_check CHECK ((outcome = ANY (ARRAY['DELIVERED'::text, 'NOT_DELIVERED'::text])))
);

-- table outbox_migration

CREATE TABLE outbox.outbox_migration (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

-- table outbox_operator_audit

CREATE TABLE outbox.outbox_operator_audit (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    verb text NOT NULL,
    action_id bigint,
    kind text,
    outcome text NOT NULL,
    detail jsonb
);

-- sequence outbox_operator_audit_id_seq

ALTER TABLE outbox.outbox_operator_audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.outbox_operator_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- table outbox_process

CREATE TABLE outbox.outbox_process (
    process_id text NOT NULL,
    role text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    kinds text[] DEFAULT '{}'::text[] NOT NULL,
    started_at timestamp with time zone NOT NULL,
    last_seen timestamp with time zone DEFAULT now() NOT NULL,
    in_flight integer DEFAULT 0 NOT NULL,
    beating_since timestamp with time zone,
    CONSTRAINT outbox_process_in_flight_check CHECK ((in_flight >= 0)),
    CONSTRAINT outbox_process_role_check CHECK ((role = ANY (ARRAY['claimer'::text, 'worker'::text])))
);

-- table webhook_subscription

CREATE TABLE outbox.webhook_subscription (
    id bigint NOT NULL,
    endpoint_url text NOT NULL,
    secrets text[] NOT NULL,
    event_types text[] NOT NULL,
    enabled boolean DEFAULT true NOT NULL,
    consecutive_failures integer DEFAULT 0 NOT NULL,
    disabled_at timestamp with time zone,
    disabled_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT webhook_subscription_check CHECK ((enabled = (disabled_at IS NULL))),
    CONSTRAINT webhook_subscription_consecutive_failures_check CHECK ((consecutive_failures >= 0)),
    CONSTRAINT webhook_subscription_endpoint_url_check CHECK ((endpoint_url ~* '^https?://'::text)),
    CONSTRAINT webhook_subscription_event_types_check CHECK ((cardinality(event_types) >= 1)),
    CONSTRAINT webhook_subscription_secrets_check CHECK ((cardinality(secrets) >= 1))
);

-- sequence webhook_subscription_id_seq

ALTER TABLE outbox.webhook_subscription ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.webhook_subscription_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

-- constraint agent_action_attempt agent_action_attempt_pkey

ALTER TABLE ONLY outbox.agent_action_attempt
    ADD CONSTRAINT agent_action_attempt_pkey PRIMARY KEY (action_id, epoch);

-- constraint agent_action_kind_outage agent_action_kind_outage_pkey

ALTER TABLE ONLY outbox.agent_action_kind_outage
    ADD CONSTRAINT agent_action_kind_outage_pkey PRIMARY KEY (kind);

-- constraint agent_action_kind_pause agent_action_kind_pause_pkey

ALTER TABLE ONLY outbox.agent_action_kind_pause
    ADD CONSTRAINT agent_action_kind_pause_pkey PRIMARY KEY (kind);

-- constraint agent_action_kind agent_action_kind_pkey

ALTER TABLE ONLY outbox.agent_action_kind
    ADD CONSTRAINT agent_action_kind_pkey PRIMARY KEY (name);

-- constraint agent_action_lane_intake agent_action_lane_intake_pkey

ALTER TABLE ONLY outbox.agent_action_lane_intake
    ADD CONSTRAINT agent_action_lane_intake_pkey PRIMARY KEY (seq);

-- constraint agent_action_lane agent_action_lane_pkey

ALTER TABLE ONLY outbox.agent_action_lane
    ADD CONSTRAINT agent_action_lane_pkey PRIMARY KEY (lane_key);

-- constraint agent_action_link agent_action_link_pkey

ALTER TABLE ONLY outbox.agent_action_link
    ADD CONSTRAINT agent_action_link_pkey PRIMARY KEY (from_id, to_id);

-- constraint agent_action_parked_payload agent_action_parked_payload_pkey

ALTER TABLE ONLY outbox.agent_action_parked_payload
    ADD CONSTRAINT agent_action_parked_payload_pkey PRIMARY KEY (action_id);

-- constraint agent_action agent_action_pkey

ALTER TABLE ONLY outbox.agent_action
    ADD CONSTRAINT agent_action_pkey PRIMARY KEY (id);

-- constraint agent_action_rate agent_action_rate_pkey

ALTER TABLE ONLY outbox.agent_action_rate
    ADD CONSTRAINT agent_action_rate_pkey PRIMARY KEY (bucket);

-- constraint agent_action_resolution agent_action_resolution_pkey

ALTER TABLE ONLY outbox.agent_action_resolution
    ADD CONSTRAINT agent_action_resolution_pkey PRIMARY KEY (action_id);

-- constraint outbox_migration outbox_migration_pkey

ALTER TABLE ONLY outbox.outbox_migration
    ADD CONSTRAINT outbox_migration_pkey PRIMARY KEY (version);

-- constraint outbox_operator_audit outbox_operator_audit_pkey

ALTER TABLE ONLY outbox.outbox_operator_audit
    ADD CONSTRAINT outbox_operator_audit_pkey PRIMARY KEY (id);

-- constraint outbox_process outbox_process_pkey

ALTER TABLE ONLY outbox.outbox_process
    ADD CONSTRAINT outbox_process_pkey PRIMARY KEY (process_id);

-- constraint agent_action ux_agent_action_idempotency_key

ALTER TABLE ONLY outbox.agent_action
    ADD CONSTRAINT ux_agent_action_idempotency_key UNIQUE (idempotency_key);

-- constraint webhook_subscription webhook_subscription_pkey

ALTER TABLE ONLY outbox.webhook_subscription
    ADD CONSTRAINT webhook_subscription_pkey PRIMARY KEY (id);

-- index ix_agent_action_deferred

CREATE INDEX ix_agent_action_deferred ON outbox.agent_action USING btree (kind, available_at) WHERE ((state = 'ADMITTED'::text) AND (available_at > created_at));

-- index ix_agent_action_ended

CREATE INDEX ix_agent_action_ended ON outbox.agent_action USING btree (ended_at) WHERE (ended_at IS NOT NULL);

-- index ix_agent_action_expiry

CREATE INDEX ix_agent_action_expiry ON outbox.agent_action USING btree (expires_at) WHERE ((state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text])) AND (expires_at IS NOT NULL));

-- index ix_agent_action_kind_outage_held

CREATE INDEX ix_agent_action_kind_outage_held ON outbox.agent_action_kind_outage USING btree (held_until) WHERE (held_until IS NOT NULL);

-- index ix_agent_action_lane_intake_priority

CREATE INDEX ix_agent_action_lane_intake_priority ON outbox.agent_action_lane_intake USING btree (priority DESC, seq);

-- index ix_agent_action_lane_ready

CREATE INDEX ix_agent_action_lane_ready ON outbox.agent_action_lane USING btree (head_kind, head_limit_key, head_priority DESC, head_due_at) WHERE ((executing_id IS NULL) AND (head_due_at IS NOT NULL) AND (NOT head_scheduled));

-- index ix_agent_action_lane_scheduled

CREATE INDEX ix_agent_action_lane_scheduled ON outbox.agent_action_lane USING btree (head_due_at) WHERE head_scheduled;

-- index ix_agent_action_lane_scheduled_kind

CREATE INDEX ix_agent_action_lane_scheduled_kind ON outbox.agent_action_lane USING btree (head_kind, head_due_at) WHERE head_scheduled;

-- index ix_agent_action_lane_waiting

CREATE INDEX ix_agent_action_lane_waiting ON outbox.agent_action USING btree (lane_key, id) WHERE (state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text]));

-- index ix_agent_action_lease

CREATE INDEX ix_agent_action_lease ON outbox.agent_action USING btree (lease_until) WHERE ((state = 'EXECUTING'::text) AND (lease_until IS NOT NULL));

-- index ix_agent_action_link_to

CREATE INDEX ix_agent_action_link_to ON outbox.agent_action_link USING btree (to_id);

-- index ix_agent_action_parked_payload_at

CREATE INDEX ix_agent_action_parked_payload_at ON outbox.agent_action_parked_payload USING btree (parked_at);

-- index ix_agent_action_subject

CREATE INDEX ix_agent_action_subject ON outbox.agent_action USING btree (subject_account_id) WHERE (subject_account_id IS NOT NULL);

-- index ix_outbox_operator_audit_action

CREATE INDEX ix_outbox_operator_audit_action ON outbox.outbox_operator_audit USING btree (action_id) WHERE (action_id IS NOT NULL);

-- index ix_outbox_operator_audit_at

CREATE INDEX ix_outbox_operator_audit_at ON outbox.outbox_operator_audit USING btree (at);

-- index ix_outbox_process_last_seen

CREATE INDEX ix_outbox_process_last_seen ON outbox.outbox_process USING btree (last_seen);

-- index ix_webhook_subscription_enabled

CREATE INDEX ix_webhook_subscription_enabled ON outbox.webhook_subscription USING btree (id) WHERE enabled;

-- index ux_agent_action_lane_executing

CREATE UNIQUE INDEX ux_agent_action_lane_executing ON outbox.agent_action USING btree (lane_key) WHERE (state = 'EXECUTING'::text);

-- trigger agent_action agent_action_inserted

CREATE TRIGGER agent_action_inserted AFTER INSERT ON outbox.agent_action REFERENCING NEW TABLE AS new_actions FOR EACH STATEMENT EXECUTE FUNCTION outbox.agent_action_inserted();

-- trigger agent_action_kind agent_action_kind_in_use

CREATE TRIGGER agent_action_kind_in_use BEFORE DELETE ON outbox.agent_action_kind FOR EACH ROW EXECUTE FUNCTION outbox.agent_action_kind_in_use();

-- trigger agent_action_kind agent_action_kind_renamed

CREATE TRIGGER agent_action_kind_renamed BEFORE UPDATE ON outbox.agent_action_kind FOR EACH ROW WHEN ((new.name IS DISTINCT FROM old.name)) EXECUTE FUNCTION outbox.agent_action_kind_in_use();

-- trigger agent_action agent_action_lane_track_delete

CREATE TRIGGER agent_action_lane_track_delete AFTER DELETE ON outbox.agent_action FOR EACH ROW WHEN ((old.state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text, 'EXECUTING'::text]))) EXECUTE FUNCTION outbox.agent_action_lane_track();

-- trigger agent_action agent_action_lanes_moved

CREATE TRIGGER agent_action_lanes_moved AFTER UPDATE ON outbox.agent_action REFERENCING OLD TABLE AS old_actions NEW TABLE AS new_actions FOR EACH STATEMENT EXECUTE FUNCTION outbox.agent_action_lanes_moved();

-- trigger agent_action guard_agent_action

CREATE TRIGGER guard_agent_action AFTER UPDATE ON outbox.agent_action REFERENCING OLD TABLE AS old_actions NEW TABLE AS new_actions FOR EACH STATEMENT EXECUTE FUNCTION outbox.guard_agent_action();

-- fk constraint agent_action_kind_outage agent_action_kind_outage_kind_fkey

ALTER TABLE ONLY outbox.agent_action_kind_outage
    ADD CONSTRAINT agent_action_kind_outage_kind_fkey FOREIGN KEY (kind) REFERENCES outbox.agent_action_kind(name) ON DELETE CASCADE;

-- fk constraint agent_action_kind_pause agent_action_kind_pause_kind_fkey

ALTER TABLE ONLY outbox.agent_action_kind_pause
    ADD CONSTRAINT agent_action_kind_pause_kind_fkey FOREIGN KEY (kind) REFERENCES outbox.agent_action_kind(name) ON DELETE CASCADE;
