-- 0016: the lane functions plan their statements once a session, not on every call.
--
-- PL/pgSQL passes a function's variables to its statements as parameters, and PostgreSQL's plan
-- cache (plan_cache_mode = auto) plans a statement afresh for every call while that custom plan
-- looks cheaper than the generic one. An array variable of one element (the lanes of a single
-- enqueue, a claim or a finish) always makes it look so: agent_action_lanes_moved (every
-- claim, take, fence and finish) and the fold (every claim round) spent about half their time
-- planning, half a millisecond to a millisecond a call, on the claim's path to the worker.
--
-- Both now run with plan_cache_mode = force_generic_plan, as agent_action_kinds_waiting (a
-- SQL function with a SET clause, which PostgreSQL plans on every call, now PL/pgSQL). A
-- generic plan does not know how long an array is, so every statement of those paths is one
-- whose plan stays linear whatever the plan guesses: each array element reaches a table through
-- an index (a join on the lane key or the intake's seq), never a comparison with every element
-- of another array. The fold's test for a lane it just made (`lane_key = ANY (fresh)`, a scan
-- of the array a row without a custom plan's hashed lookup) is gone: the lanes that had a row
-- are told apart from the fresh ones in the statement that looks for their rows. The fold's
-- rare slow path (a lane row a finish held) compares arrays with each other and keeps custom
-- plans, in a function of its own.

CREATE OR REPLACE FUNCTION agent_action_lane_intake(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    batch bigint[];
    takes integer[];
    keys text[];
    holds timestamptz[];
    fresh text[];
    existing text[];
    existing_holds timestamptz[];
    folded text[];
    taken integer;
    lane record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2831, hashtext(current_schema())) THEN
        RETURN 0;
    END IF;
    -- The rows this fold takes from, and how many of each row's lanes (a prefix), as in 0015.
    SELECT array_agg(t.seq), array_agg(t.take), sum(t.take) INTO batch, takes, taken
      FROM (SELECT p.seq, max(p.take)::integer AS take
              FROM (SELECT w.seq, least(w.lanes, p_limit - w.before) AS take
                      FROM (SELECT i.seq, i.lanes,
                                   sum(i.lanes) OVER (ORDER BY i.priority DESC, i.seq
                                                      ROWS UNBOUNDED PRECEDING) - i.lanes
                                       AS before
                              FROM (SELECT seq, priority, lanes FROM agent_action_lane_intake
                                     ORDER BY priority DESC, seq LIMIT p_limit) i) w
                     WHERE w.before < p_limit
                    UNION ALL
                    SELECT r.seq, least(r.lanes, 64)
                      FROM (SELECT seq, lanes FROM agent_action_lane_intake
                             ORDER BY seq DESC LIMIT 64) r) p
             GROUP BY p.seq) t;
    IF batch IS NULL THEN
        RETURN 0;
    END IF;
    SELECT array_agg(k.lane_key ORDER BY k.lane_key), array_agg(k.hold ORDER BY k.lane_key)
      INTO keys, holds
      FROM (SELECT u.lane_key, max(i.busy_until) AS hold
              FROM unnest(batch, takes) AS b(seq, take)
              JOIN agent_action_lane_intake i ON i.seq = b.seq
             CROSS JOIN LATERAL
                   unnest(coalesce(i.lane_keys[1:b.take], ARRAY[i.lane_key])) AS u(lane_key)
             GROUP BY u.lane_key) k;

    -- Which lanes have a row (refreshed below) and which are fresh (made here), one index
    -- probe a lane.
    SELECT coalesce(array_agg(k.lane_key ORDER BY k.lane_key) FILTER (WHERE l.lane_key IS NULL),
                    '{}'),
           coalesce(array_agg(k.lane_key ORDER BY k.lane_key) FILTER (WHERE l.lane_key IS NOT NULL),
                    '{}'),
           coalesce(array_agg(k.hold ORDER BY k.lane_key) FILTER (WHERE l.lane_key IS NOT NULL),
                    '{}')
      INTO fresh, existing, existing_holds
      FROM unnest(keys, holds) AS k(lane_key, hold)
      LEFT JOIN agent_action_lane l ON l.lane_key = k.lane_key;
    INSERT INTO agent_action_lane
        (lane_key, head_id, head_kind, head_due_at, head_priority, head_limit_key)
    SELECT f.lane_key, h.id, h.kind, CASE WHEN h.state = 'ADMITTED' THEN h.available_at END,
           h.priority, coalesce(h.limit_key, h.workspace_id, '')
      FROM unnest(fresh) AS f(lane_key)
      JOIN LATERAL (SELECT a.id, a.kind, a.state, a.available_at, a.priority, a.limit_key,
                           a.workspace_id
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
          FROM unnest(existing, existing_holds) AS k(lane_key, hold)
          JOIN agent_action_lane l ON l.lane_key = k.lane_key
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

    IF cardinality(folded) = cardinality(keys) THEN
        -- Every lane taken was folded: a row taken whole leaves, a row taken in part keeps the
        -- lanes after its prefix.
        DELETE FROM agent_action_lane_intake i
         USING unnest(batch, takes) AS b(seq, take)
         WHERE i.seq = b.seq AND i.lanes <= b.take;
        UPDATE agent_action_lane_intake i
           SET lane_keys = i.lane_keys[b.take + 1:], lanes = i.lanes - b.take
          FROM unnest(batch, takes) AS b(seq, take)
         WHERE i.seq = b.seq AND i.lanes > b.take;
        RETURN taken;
    END IF;
    RETURN agent_action_lane_intake_held(batch, takes, keys, folded, taken);
END;
$$;

-- The fold's slow path: some lanes' rows were held (by a finish), and their entries stay for
-- the next claim (as in 0015). It compares the lanes taken with those folded, arrays of up to
-- p_limit each: custom plans, which know their lengths.
CREATE FUNCTION agent_action_lane_intake_held(
    batch bigint[], takes integer[], keys text[], folded text[], taken integer
) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = auto AS $$
DECLARE
    skipped text[];
BEGIN
    SELECT array_agg(k.lane_key) INTO skipped
      FROM unnest(keys) AS k(lane_key)
     WHERE NOT EXISTS (SELECT 1 FROM unnest(folded) AS f(lane_key) WHERE f.lane_key = k.lane_key);
    WITH kept AS (
        UPDATE agent_action_lane_intake i
           SET lane_keys = coalesce(h.held, '{}') || i.lane_keys[b.take + 1:],
               lanes = coalesce(cardinality(h.held), 0) + i.lanes - b.take
          FROM unnest(batch, takes) AS b(seq, take)
          LEFT JOIN (SELECT x.seq, array_agg(u.lane_key ORDER BY u.n) AS held
                       FROM unnest(batch, takes) AS c(seq, take)
                       JOIN agent_action_lane_intake x ON x.seq = c.seq
                      CROSS JOIN LATERAL
                            unnest(x.lane_keys[1:c.take]) WITH ORDINALITY AS u(lane_key, n)
                       JOIN unnest(skipped) AS s(lane_key) ON s.lane_key = u.lane_key
                      GROUP BY x.seq) h ON h.seq = b.seq
         WHERE i.seq = b.seq AND i.lane_keys IS NOT NULL
        RETURNING coalesce(cardinality(h.held), 0) AS held)
    SELECT taken - coalesce(sum(kept.held), 0) INTO taken FROM kept;
    DELETE FROM agent_action_lane_intake i
     USING unnest(batch) AS b(seq)
     WHERE i.seq = b.seq
       AND (i.lanes = 0
            OR (i.lane_keys IS NULL
                AND NOT EXISTS (SELECT 1 FROM unnest(skipped) AS s(lane_key)
                                 WHERE s.lane_key = i.lane_key)));
    -- The single rows of the batch left are the held ones.
    RETURN taken - (SELECT count(*)::integer
                      FROM unnest(batch) AS b(seq)
                      JOIN agent_action_lane_intake i ON i.seq = b.seq
                     WHERE i.lane_keys IS NULL);
END;
$$;

-- Every statement of the lane tracker reaches the lane and action tables through an index a
-- lane (0014); its first query, over the transition tables only, has no parameters at all.
ALTER FUNCTION agent_action_lanes_moved() SET plan_cache_mode = force_generic_plan;

CREATE OR REPLACE FUNCTION agent_action_kinds_waiting(p_kinds text[]) RETURNS text[]
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    -- One probe of ix_agent_action_lane_ready a kind: its first entry, due or scheduled.
    RETURN (SELECT coalesce(array_agg(k.kind), '{}')
              FROM unnest(p_kinds) AS k(kind)
             WHERE EXISTS (SELECT 1 FROM agent_action_lane l
                            WHERE l.head_kind = k.kind
                              AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL));
END;
$$;
