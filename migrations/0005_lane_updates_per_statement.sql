-- 0005: an update moves its lanes once a statement, set-based, not once a row.
--
-- A claim of 100 lane heads and a group-committed finish of 100 attempts each ran
-- agent_action_lane_track and agent_action_lane_refresh once a row: four statements a row (lock
-- the lane, find its head, find its executing action, write the lane), measured at 34-43 us a
-- row, more than half of either statement's time. The lanes an update moved are now refreshed
-- together by one statement-level function over the statement's transition tables, which locks
-- their lane rows in lane_key order (so two statements over the same lanes cannot deadlock
-- here) and computes every head in one query. What a lane row holds after a statement, and when
-- the claimers are woken, is unchanged; a delete (an erasure, a prune of a live action) still
-- refreshes its lane row by row.

-- The lanes in p_lanes (distinct, in lane_key order) are brought in step with their actions:
-- head, its kind and due time, the executing action; a lane with neither is deleted, unless an
-- erased write still holds it (then it is kept, empty). Wakes the claimers when a lane has
-- nothing executing and a due ADMITTED head. Called only from agent_action_updated, which runs
-- on the outbox's search_path.
CREATE FUNCTION agent_action_lanes_refresh(p_lanes text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    missing text[];
    woken boolean;
BEGIN
    PERFORM 1 FROM agent_action_lane WHERE lane_key = ANY(p_lanes) ORDER BY lane_key FOR UPDATE;
    SELECT array_agg(k ORDER BY k) INTO missing
      FROM unnest(p_lanes) k
     WHERE NOT EXISTS (SELECT 1 FROM agent_action_lane l WHERE l.lane_key = k);
    IF missing IS NOT NULL THEN
        INSERT INTO agent_action_lane (lane_key)
        SELECT k FROM unnest(missing) k ORDER BY k
        ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_action_lane WHERE lane_key = ANY(missing) ORDER BY lane_key FOR UPDATE;
    END IF;
    -- One snapshot for the whole refresh: the DELETE and the two UPDATEs touch disjoint lane
    -- rows (a lane is empty or not), every one of them locked above.
    WITH lane AS (
        SELECT k AS lane_key, h.id AS head_id, h.kind AS head_kind, h.state AS head_state,
               h.available_at AS head_available_at,
               CASE WHEN h.state = 'ADMITTED' THEN h.available_at END AS head_due_at,
               e.id AS executing_id
          FROM unnest(p_lanes) k
          LEFT JOIN LATERAL (
                SELECT a.id, a.kind, a.state, a.available_at
                  FROM agent_action a
                 WHERE a.lane_key = k AND a.state IN ('PROPOSED', 'ADMITTED')
                 ORDER BY a.id LIMIT 1) h ON true
          LEFT JOIN LATERAL (
                SELECT a.id
                  FROM agent_action a
                 WHERE a.lane_key = k AND a.state = 'EXECUTING'
                 LIMIT 1) e ON true
    ),
    deleted AS (
        DELETE FROM agent_action_lane l
         USING lane s
         WHERE l.lane_key = s.lane_key AND s.head_id IS NULL AND s.executing_id IS NULL
           AND (l.busy_until IS NULL OR l.busy_until <= now())
    ),
    emptied AS (  -- held by an erased write: keep the row, empty
        UPDATE agent_action_lane l
           SET head_id = NULL, head_kind = NULL, head_due_at = NULL, executing_id = NULL
          FROM lane s
         WHERE l.lane_key = s.lane_key AND s.head_id IS NULL AND s.executing_id IS NULL
           AND l.busy_until > now()
    ),
    moved AS (
        UPDATE agent_action_lane l
           SET head_id = s.head_id, head_kind = s.head_kind, head_due_at = s.head_due_at,
               executing_id = s.executing_id
          FROM lane s
         WHERE l.lane_key = s.lane_key AND (s.head_id IS NOT NULL OR s.executing_id IS NOT NULL)
           AND (l.head_id, l.head_kind, l.head_due_at, l.executing_id) IS DISTINCT FROM
               (s.head_id, s.head_kind, s.head_due_at, s.executing_id)
    )
    SELECT coalesce(bool_or(s.executing_id IS NULL AND s.head_state = 'ADMITTED'
                            AND s.head_available_at <= now()), false)
      INTO woken
      FROM lane s;
    IF woken THEN
        PERFORM pg_notify('outbox_' || current_schema(), '');
    END IF;
END;
$$;

-- An update: the lanes whose action changed state, or whose waiting action's due time changed
-- (the test agent_action_lane_track's WHEN clause made), refreshed once for the statement.
CREATE FUNCTION agent_action_updated() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    lanes text[];
BEGIN
    SELECT array_agg(DISTINCT n.lane_key ORDER BY n.lane_key) INTO lanes
      FROM new_actions n
      JOIN old_actions o ON o.id = n.id
     WHERE n.state IS DISTINCT FROM o.state
        OR (n.state = 'ADMITTED' AND n.available_at IS DISTINCT FROM o.available_at);
    IF lanes IS NOT NULL THEN
        PERFORM agent_action_lanes_refresh(lanes);
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER agent_action_lane_track ON agent_action;
CREATE TRIGGER agent_action_updated
    AFTER UPDATE ON agent_action
    REFERENCING OLD TABLE AS old_actions NEW TABLE AS new_actions
    FOR EACH STATEMENT EXECUTE FUNCTION agent_action_updated();
