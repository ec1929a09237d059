-- 0004: the triggers run only when they can change or refuse something, and once a statement
-- where they can.
--
-- Every plpgsql call with `SET search_path FROM CURRENT` costs a GUC save and restore besides the
-- call itself, on every row it fires for (docs/benchmarks.md). An action's life
-- writes its row five times (the enqueue's insert, claim, take, fence, finish), and the take and
-- the fence change only taken_epoch or write_started_at of an EXECUTING row: nothing either
-- trigger checks or tracks. WHEN clauses, evaluated without a function call, now keep those
-- updates out of both functions. An insert (one action, or a thousand from enqueue_many) now
-- runs one statement-level function over the inserted rows instead of two row functions a row.
-- What is refused, with which message, and how the lane rows are kept, is unchanged.

-- An insert: the guard's rules for a new action, then each lane's head, set-based, then the
-- claimers' wake-up (one function a statement where there were two).
CREATE FUNCTION agent_action_inserted() RETURNS trigger
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
    -- Ids rise, so a new action becomes the head only of a lane without one (or, when
    -- transactions commit out of id order, of a lane whose head is younger). Lane rows are
    -- locked in lane_key order, so two batches over the same lanes cannot deadlock here.
    INSERT INTO agent_action_lane AS l (lane_key, head_id, head_kind, head_due_at)
    SELECT DISTINCT ON (n.lane_key)
           n.lane_key, n.id, n.kind, CASE WHEN n.state = 'ADMITTED' THEN n.available_at END
      FROM new_actions n
     ORDER BY n.lane_key, n.id
    ON CONFLICT (lane_key) DO UPDATE
       SET head_id = excluded.head_id, head_kind = excluded.head_kind,
           head_due_at = excluded.head_due_at
     WHERE l.head_id IS NULL OR l.head_id > excluded.head_id;
    -- Wakes the claimers (LISTEN outbox_<schema>), as agent_action_notify did, now dropped.
    PERFORM pg_notify('outbox_' || current_schema(), '');
    RETURN NULL;
END;
$$;

DROP TRIGGER guard_agent_action ON agent_action;
DROP TRIGGER agent_action_notify ON agent_action;
DROP FUNCTION agent_action_notify();
CREATE TRIGGER agent_action_inserted
    AFTER INSERT ON agent_action
    REFERENCING NEW TABLE AS new_actions
    FOR EACH STATEMENT EXECUTE FUNCTION agent_action_inserted();

-- The guard (its function keeps its INSERT branch, now unused) runs on an update when the row
-- has ended (always refused), or when anything it checks changes: the state, the epoch, or an
-- identity column.
CREATE TRIGGER guard_agent_action
    BEFORE UPDATE ON agent_action
    FOR EACH ROW
    WHEN (OLD.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
          OR NEW.state IS DISTINCT FROM OLD.state
          OR NEW.epoch IS DISTINCT FROM OLD.epoch
          OR (NEW.id, NEW.kind, NEW.lane_key, NEW.idempotency_key, NEW.workspace_id, NEW.created_at)
             IS DISTINCT FROM
             (OLD.id, OLD.kind, OLD.lane_key, OLD.idempotency_key, OLD.workspace_id, OLD.created_at))
    EXECUTE FUNCTION guard_agent_action();

-- The lane tracker: an update only when it moves a lane (a change of state, or of a waiting
-- action's due time), as the function's own first test says; a delete of a live action.
DROP TRIGGER agent_action_lane_track ON agent_action;
CREATE TRIGGER agent_action_lane_track
    AFTER UPDATE ON agent_action
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state
          OR (NEW.state = 'ADMITTED' AND NEW.available_at IS DISTINCT FROM OLD.available_at))
    EXECUTE FUNCTION agent_action_lane_track();
CREATE TRIGGER agent_action_lane_track_delete
    AFTER DELETE ON agent_action
    FOR EACH ROW
    WHEN (OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING'))
    EXECUTE FUNCTION agent_action_lane_track();

-- The lane refresh, as in 0003, with two changes:
-- - no SET search_path of its own: only agent_action_lane_track calls it, which runs on the
--   outbox's search_path already (a second save and restore a call);
-- - when the lane has nothing executing and its head is due, it wakes the claimers (the same
--   NOTIFY an enqueue sends): a finish whose lane has a successor, an admit, an erasure. Before,
--   a successor waited for the claimer's next poll (50 ms while busy), so one lane ran at most
--   about 20 actions a second. PostgreSQL folds a transaction's identical NOTIFYs into one.
CREATE OR REPLACE FUNCTION agent_action_lane_refresh(p_lane text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    head record;
    executing bigint;
BEGIN
    PERFORM 1 FROM agent_action_lane WHERE lane_key = p_lane FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO agent_action_lane (lane_key) VALUES (p_lane) ON CONFLICT DO NOTHING;
        PERFORM 1 FROM agent_action_lane WHERE lane_key = p_lane FOR UPDATE;
    END IF;
    SELECT a.id, a.kind, a.state, a.available_at INTO head
      FROM agent_action a
     WHERE a.lane_key = p_lane AND a.state IN ('PROPOSED', 'ADMITTED')
     ORDER BY a.id LIMIT 1;
    SELECT a.id INTO executing FROM agent_action a WHERE a.lane_key = p_lane AND a.state = 'EXECUTING';
    IF head.id IS NULL AND executing IS NULL THEN
        DELETE FROM agent_action_lane
         WHERE lane_key = p_lane AND (busy_until IS NULL OR busy_until <= now());
        IF NOT FOUND THEN  -- held by an erased write: keep the row, empty
            UPDATE agent_action_lane
               SET head_id = NULL, head_kind = NULL, head_due_at = NULL, executing_id = NULL
             WHERE lane_key = p_lane;
        END IF;
    ELSE
        UPDATE agent_action_lane l
           SET head_id = head.id,
               head_kind = head.kind,
               head_due_at = CASE WHEN head.state = 'ADMITTED' THEN head.available_at END,
               executing_id = executing
         WHERE l.lane_key = p_lane
           AND (l.head_id, l.head_kind, l.head_due_at, l.executing_id) IS DISTINCT FROM
               (head.id, head.kind, CASE WHEN head.state = 'ADMITTED' THEN head.available_at END, executing);
        IF executing IS NULL AND head.state = 'ADMITTED' AND head.available_at <= now() THEN
            PERFORM pg_notify('outbox_' || current_schema(), '');
        END IF;
    END IF;
END;
$$;
