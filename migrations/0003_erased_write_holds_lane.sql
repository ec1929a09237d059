-- 0003: an erased write still holds its lane until its lease ends.
--
-- Erasure deletes an executing action at once, but an attempt that already passed its fence may
-- still be calling the provider (erasure does not recall a write that already passed its
-- fence). Its lane must not start the next action while that call can still run, or two
-- actions of one lane would be in flight together. The lane row keeps busy_until = the erased
-- action's lease end; claims skip the lane until then, and the row is not dropped before it.

ALTER TABLE agent_action_lane ADD COLUMN busy_until timestamptz;

CREATE OR REPLACE FUNCTION agent_action_lane_refresh(p_lane text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION agent_action_lane_track() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- Ids rise, so a new action becomes the head only of a lane without one (or, when
        -- transactions commit out of id order, of a lane whose head is younger).
        INSERT INTO agent_action_lane AS l (lane_key, head_id, head_kind, head_due_at)
        VALUES (NEW.lane_key, NEW.id, NEW.kind,
                CASE WHEN NEW.state = 'ADMITTED' THEN NEW.available_at END)
        ON CONFLICT (lane_key) DO UPDATE
           SET head_id = excluded.head_id, head_kind = excluded.head_kind,
               head_due_at = excluded.head_due_at
         WHERE l.head_id IS NULL OR l.head_id > excluded.head_id;
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL THEN
            -- The erased attempt may still be writing: hold the lane until its lease ends.
            INSERT INTO agent_action_lane AS l (lane_key, busy_until)
            VALUES (OLD.lane_key, OLD.lease_until)
            ON CONFLICT (lane_key) DO UPDATE
               SET busy_until = greatest(l.busy_until, excluded.busy_until);
        END IF;
        IF OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING') THEN
            PERFORM agent_action_lane_refresh(OLD.lane_key);
        END IF;
        RETURN NULL;
    END IF;
    -- UPDATE: only a change of state, or of a waiting action's due time, moves a lane.
    IF NEW.state IS DISTINCT FROM OLD.state
       OR (NEW.state = 'ADMITTED' AND NEW.available_at IS DISTINCT FROM OLD.available_at) THEN
        PERFORM agent_action_lane_refresh(NEW.lane_key);
    END IF;
    RETURN NULL;
END;
$$;
