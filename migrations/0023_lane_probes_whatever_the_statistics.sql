-- 0023: the lane functions reach each lane row and intake row by a probe of their own, whatever
-- the statistics said when their plans were made.
--
-- The lane functions plan once a session (0016), and a lane table that keeps rows only while
-- actions wait (0021) is usually near empty when it is analyzed: its statistics then say "pages,
-- but no rows", and the planner, which scales the row count by the table's current pages,
-- estimates a single row however large the table has grown since. Joining the lanes of a
-- statement to the lane table (`unnest(keys) JOIN agent_action_lane ON lane_key`) then looks
-- as cheap done as a scan of the table as done as a probe a lane, and a plan made so compares
-- every lane row with every lane of the statement: under a backlog of tens of thousands of
-- waiting lanes, the lane tracker of a claim of 96 took 0.2 to 1.3 s, and a claimer fell to a
-- third of its pace with its cores idle, until the next ANALYZE made the plans anew.
--
-- Now no plan of these functions can scan a lane table:
--
-- - a lane row is read or locked in a LATERAL subquery that the planner cannot merge into a
--   join (OFFSET 0, or a row lock), with the lane key as its only condition: a probe of the
--   primary key a lane;
-- - a lane row is deleted or updated by its tuple id, which the probe read (the row is locked
--   by then, so the id holds to the end of the statement): a TID scan a lane;
-- - the fold reads and rewrites its intake rows by the tuple ids its first query read (only
--   the fold, under its advisory lock, changes an intake row; a row it rewrites gets a new id,
--   which the rewrite returns);
-- - these functions run with enable_seqscan = off: for a probe, a sequential scan of a one-page
--   table looks cheaper than the index, and a plan made so would scan the whole table a lane
--   once it grew. Every statement here has an index or a tuple id to go by.

CREATE OR REPLACE FUNCTION agent_action_lanes_moved() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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
            (lane_key, head_id, head_kind, head_due_at, head_priority, head_limit_key,
             executing_id)
        SELECT k.lane_key, h.id, h.kind, CASE WHEN h.state = 'ADMITTED' THEN h.available_at END,
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
           SET head_id = NULL, head_kind = NULL, head_due_at = NULL,
               executing_id = lane.executing_id
          FROM lane
         WHERE l.ctid = lane.tid
           AND lane.head_id IS NULL
           AND l.busy_until > now()
    ), busy AS (
        UPDATE agent_action_lane l
           SET head_id = lane.head_id, head_kind = lane.head_kind,
               head_due_at = lane.head_due_at, executing_id = lane.executing_id,
               head_priority = lane.head_priority, head_limit_key = lane.head_limit_key
          FROM lane
         WHERE l.ctid = lane.tid
           AND lane.executing_id IS NOT NULL AND lane.head_id IS NOT NULL
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

CREATE OR REPLACE FUNCTION agent_action_lane_intake(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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
        RETURN 0;
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
            (lane_key, head_id, head_kind, head_due_at, head_priority, head_limit_key,
             executing_id, busy_until)
        SELECT p.lane_key, p.id, p.kind, CASE WHEN p.state = 'ADMITTED' THEN p.available_at END,
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
        RETURN taken;
    END IF;
    RETURN agent_action_lane_intake_held(tids, takes, keys, folded, taken);
END;
$$;

-- The fold's slow path: some lanes' rows were held (by a finish), and their entries stay for
-- the next claim (as in 0015). It compares the lanes taken with those folded, arrays of up to
-- p_limit each: custom plans, which know their lengths. The intake rows are reached by their
-- tuple ids; a row rewritten here has a new one, which the rewrite returns.
DROP FUNCTION agent_action_lane_intake_held(bigint[], integer[], text[], text[], integer);
CREATE FUNCTION agent_action_lane_intake_held(
    tids tid[], takes integer[], keys text[], folded text[], taken integer
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = auto
SET enable_seqscan = off
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

-- A lane's refresh reads and writes its row by the lane key: the primary key, never a scan.
ALTER FUNCTION agent_action_lane_refresh(text) SET enable_seqscan = off;

CREATE OR REPLACE FUNCTION agent_action_kinds_waiting(p_kinds text[]) RETURNS text[]
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
BEGIN
    -- One probe of ix_agent_action_lane_ready a kind: its first entry, due or scheduled
    -- (OFFSET 0: a probe a kind, not a semi-join over the lane table).
    RETURN (SELECT coalesce(array_agg(k.kind), '{}')
              FROM unnest(p_kinds) AS k(kind)
             WHERE EXISTS (SELECT 1 FROM agent_action_lane l
                            WHERE l.head_kind = k.kind
                              AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                           OFFSET 0));
END;
$$;
