-- 0031: a lane whose head is scheduled for later waits outside the claim's index until it is due.
--
-- A claim walks the limit keys (workspaces, unless the actions name others) that have lane
-- heads in ix_agent_action_lane_ready, up to 32 a claim, and takes each key's due heads. A head
-- scheduled for later (`not_before`, a retry's or a deferral's backoff) was in that index too,
-- so a key whose heads were all scheduled was walked and gave nothing: with more than 32 such
-- keys in a row, a claim walked only them and came back empty while actions of the keys after
-- them were due. The in-process executor then stopped as if idle (1,000 workspaces with a
-- reminder scheduled for tomorrow, and 10,000 actions due in 100 others: `run_until_idle` ran
-- none of them), and a claimer took 32 keys further at each poll, a second apart.
--
-- Now a lane row says whether its head was scheduled for later when the row was written
-- (`head_scheduled`), and the claim's index holds only the lanes whose head is not: a claim
-- walks only keys with something due. The lane intake's fold, which runs before every claim,
-- promotes the scheduled lanes that have come due since (one probe of
-- ix_agent_action_lane_scheduled, in due order, up to the fold's batch, skipping a lane row
-- another transaction holds), and counts them with the lanes it folded, so a claimer that
-- promoted a full batch looks again at once. A scheduled action is claimed at the first claim
-- after its time, and a claimer's round now says when that is (the end of this file).
--
-- The column is added with its default (no rewrite); the lanes whose head is scheduled now are
-- marked, and the claim's index is built again (the lane table holds a row only while an action
-- of its lane waits).

ALTER TABLE agent_action_lane ADD COLUMN head_scheduled boolean NOT NULL DEFAULT false;

UPDATE agent_action_lane SET head_scheduled = true WHERE head_due_at > now();

DROP INDEX ix_agent_action_lane_ready;
CREATE INDEX ix_agent_action_lane_ready
    ON agent_action_lane (head_kind, head_limit_key, head_priority DESC, head_due_at)
    WHERE executing_id IS NULL AND head_due_at IS NOT NULL AND NOT head_scheduled;

-- The promote's (all kinds, in due order) and the claim round's soonest due time of each of its
-- kinds (a claimer may serve some kinds only: another's scheduled lanes are not stepped over).
CREATE INDEX ix_agent_action_lane_scheduled ON agent_action_lane (head_due_at)
    WHERE head_scheduled;
CREATE INDEX ix_agent_action_lane_scheduled_kind ON agent_action_lane (head_kind, head_due_at)
    WHERE head_scheduled;

-- The scheduled lanes whose head has come due, up to p_limit of them in due order, join the
-- claim's index; a lane row another transaction holds is skipped (its writer sets the flag
-- itself, or the next fold promotes it), so this never waits on a lane row. Returns how many.
CREATE FUNCTION agent_action_lane_promote(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
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

CREATE OR REPLACE FUNCTION agent_action_kinds_waiting(p_kinds text[]) RETURNS text[]
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
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

CREATE OR REPLACE FUNCTION agent_action_lane_intake(p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
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

CREATE OR REPLACE FUNCTION agent_action_lane_refresh(p_lane text) RETURNS void
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

CREATE OR REPLACE FUNCTION agent_action_lanes_moved() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path FROM CURRENT
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

-- A dispatch claim round's first look (0018) also says how long until the soonest scheduled head
-- of its kinds comes due (`next_due_in`, seconds by the database's clock at this moment; NULL
-- when none is scheduled): an idle claimer wakes for it rather than at its next poll, so a
-- scheduled action or a retry's back-off runs on time. The fold now runs in a statement of its
-- own, first, so that the look after it sees the lanes it promoted; the counts still read a
-- snapshot taken after the claim lock was granted.
DROP FUNCTION agent_action_claim_round_state(integer, text[]);
CREATE FUNCTION agent_action_claim_round_state(
    p_limit integer, p_kinds text[],
    OUT folded integer, OUT paused text[], OUT executing json, OUT waiting text[],
    OUT next_due_in double precision)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    folded := agent_action_lane_intake(p_limit);
    SELECT (SELECT coalesce(array_agg(p.kind), '{}') FROM agent_action_kind_pause p),
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
