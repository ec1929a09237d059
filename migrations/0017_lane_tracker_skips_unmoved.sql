-- 0017: the lane tracker lets a statement that changed no state go at once.
--
-- agent_action_lanes_moved runs after every UPDATE statement on agent_action. A worker's take
-- and fence (and a reclaim) keep every row EXECUTING, so no lane moves; the tracker still
-- paired every row's old and new version (both transition tables read, sorted or hashed by
-- the id) to find that out: about 15% of a fence's server time, a few microseconds a row. It
-- now first asks whether any row was or became anything but EXECUTING, which such a statement
-- answers with one pass over each table and a claim or a finish with one row of one table;
-- only then does it pair them. The rest of the function is as in 0014 (and 0016's plan mode).

CREATE OR REPLACE FUNCTION agent_action_lanes_moved() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    keys text[];
    waiting text[];
    idle text[];
    locked integer;
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
