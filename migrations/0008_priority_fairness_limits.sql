-- 0008: priority within a kind, fairness between limit keys, per-key concurrency caps, and the
-- shared rate-limit slots.
--
-- Priority. An action carries a priority (higher first, -100..100, 0 by default); its lane row
-- carries its head's, so a claim orders the due heads of a kind by (priority, due time) through
-- one index, never through a lane's backlog.
--
-- Fairness. An action carries a limit key: the workspace unless the request names another (a
-- recipient domain, a provider account; '' for an instance-level action without one). Its lane
-- row carries its head's, and a claim walks the distinct keys that have heads (one index probe
-- a key, starting after the key the previous claim ended on) and takes a fair share of each
-- key's heads, so one key's 100,000 waiting actions never starve another key's one. The same
-- key scopes the per-key concurrency caps and per-key rate limits.
--
-- Both new action columns are added without a rewrite (a constant default, and a nullable
-- column). The lane table gets its two columns the same way, then one UPDATE of its rows (one
-- row a lane with work: small next to agent_action) and its ready index is rebuilt.
--
-- Rate limits. agent_action_rate holds one row a limited bucket (a kind, or a kind and a key):
-- the time of its next free slot. A worker reserves the next slot of every bucket an action is
-- limited by in one short statement, sleeps until it, and only then runs the adapter; a
-- provider's Retry-After pushes the slot later for everyone.

ALTER TABLE agent_action ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE agent_action ADD COLUMN limit_key text;
ALTER TABLE agent_action ADD CONSTRAINT ck_agent_action_priority
    CHECK (priority BETWEEN -100 AND 100) NOT VALID;

ALTER TABLE agent_action_lane ADD COLUMN head_priority smallint NOT NULL DEFAULT 0;
ALTER TABLE agent_action_lane ADD COLUMN head_limit_key text NOT NULL DEFAULT '';

UPDATE agent_action_lane l
   SET head_limit_key = coalesce(a.limit_key, a.workspace_id, ''), head_priority = a.priority
  FROM agent_action a
 WHERE a.id = l.head_id;

-- A claim walks the keys of a kind's waiting heads, then reads each key's due heads by
-- (priority, due time).
DROP INDEX ix_agent_action_lane_ready;
CREATE INDEX ix_agent_action_lane_ready
    ON agent_action_lane (head_kind, head_limit_key, head_priority DESC, head_due_at)
    WHERE executing_id IS NULL AND head_due_at IS NOT NULL;

-- The lane intake is folded by priority first: a transactional action enqueued right after a
-- newsletter of 100,000 gets its lane row at the next claim, not after the newsletter's.
ALTER TABLE agent_action_lane_intake ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX ix_agent_action_lane_intake_priority
    ON agent_action_lane_intake (priority DESC, seq);

CREATE TABLE agent_action_rate (
    bucket     text PRIMARY KEY,               -- 'KIND' or 'KIND' || chr(31) || limit key
    next_at    timestamptz NOT NULL DEFAULT '-infinity',  -- the next free slot
    held_until timestamptz,                    -- a provider asked for a pause until then
    used_at    timestamptz NOT NULL DEFAULT now()  -- last reservation (retention of key buckets)
);

-- The lane refresh, as in 0004, keeping the head's priority and limit key.
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
    SELECT a.id, a.kind, a.state, a.available_at, a.priority,
           coalesce(a.limit_key, a.workspace_id, '') AS limit_key INTO head
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
               executing_id = executing,
               head_priority = coalesce(head.priority, 0),
               head_limit_key = coalesce(head.limit_key, '')
         WHERE l.lane_key = p_lane
           AND (l.head_id, l.head_kind, l.head_due_at, l.executing_id, l.head_priority,
                l.head_limit_key) IS DISTINCT FROM
               (head.id, head.kind, CASE WHEN head.state = 'ADMITTED' THEN head.available_at END,
                executing, coalesce(head.priority, 0), coalesce(head.limit_key, ''));
        IF executing IS NULL AND head.state = 'ADMITTED' AND head.available_at <= now() THEN
            PERFORM pg_notify('outbox_' || current_schema(), '');
        END IF;
    END IF;
END;
$$;

-- The lane intake, as in 0005, folding the most urgent intake rows first (and the newest few),
-- and creating new lane rows with their head's priority and limit key.
CREATE OR REPLACE FUNCTION agent_action_lane_intake(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch bigint[];
    keys text[];
    holds timestamptz[];
    fresh text[];
    folded text[] := '{}';
    lane record;
    n integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2831, hashtext(current_schema())) THEN
        RETURN 0;
    END IF;
    SELECT array_agg(i.seq) INTO batch
      FROM ((SELECT seq FROM agent_action_lane_intake ORDER BY priority DESC, seq LIMIT p_limit)
            UNION
            -- The newest too: a small transaction that committed after a newsletter's is not
            -- left behind its 100,000 intake rows (fairness, and the latency of a single send).
            (SELECT seq FROM agent_action_lane_intake ORDER BY seq DESC LIMIT 64)) i;
    IF batch IS NULL THEN
        RETURN 0;
    END IF;
    SELECT array_agg(k.lane_key ORDER BY k.lane_key), array_agg(k.hold ORDER BY k.lane_key)
      INTO keys, holds
      FROM (SELECT i.lane_key, max(i.busy_until) AS hold
              FROM agent_action_lane_intake i
             WHERE i.seq = ANY (batch)
             GROUP BY i.lane_key) k;

    SELECT coalesce(array_agg(k.lane_key), '{}') INTO fresh
      FROM unnest(keys) AS k(lane_key)
     WHERE NOT EXISTS (SELECT 1 FROM agent_action_lane l WHERE l.lane_key = k.lane_key);
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
          FROM agent_action_lane l
          JOIN unnest(keys, holds) AS k(lane_key, hold) ON k.lane_key = l.lane_key
         WHERE NOT (l.lane_key = ANY (fresh))
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

    DELETE FROM agent_action_lane_intake
     WHERE seq = ANY (batch) AND lane_key = ANY (folded);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- An insert, as in 0005, with each lane's highest new priority in its intake row.
CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
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
    INSERT INTO agent_action_lane_intake (lane_key, priority)
    SELECT n.lane_key, max(n.priority) FROM new_actions n GROUP BY n.lane_key;
    PERFORM pg_notify('outbox_' || current_schema(), '');
    RETURN NULL;
END;
$$;
