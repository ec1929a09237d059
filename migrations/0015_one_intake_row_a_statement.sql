-- 0015: an insert statement leaves one lane-intake row, however many lanes it touched.
--
-- agent_action_inserted (0010) appended a row a lane to agent_action_lane_intake: a heap row
-- and two index entries an action of an enqueue_many over distinct lanes, about a fifth of the
-- statement's server time at 1,000 actions (docs/benchmarks.md). An insert statement now
-- appends one row: its lane in lane_key when it touched one (a single enqueue, as before), or
-- its lanes in lane_keys, the highest priority first; `lanes` says how many a row carries.
--
-- The fold (agent_action_lane_intake()) still takes at most p_limit lanes a call, so a
-- 100,000-lane enqueue_many is folded over many claims as before: rows by priority then age
-- until p_limit lanes, the row that crosses the limit giving a prefix of its lanes, plus the
-- first 64 lanes of the newest 64 rows (a small transaction that commits after a newsletter is
-- not left behind it). What a fold took leaves the intake, except the lanes whose row a finish
-- held (SKIP LOCKED), which stay for the next claim; a row taken in part keeps its other lanes.
-- It returns how many lane entries it took off the intake (a full batch: more are waiting).

ALTER TABLE agent_action_lane_intake
    ALTER COLUMN lane_key DROP NOT NULL,
    ADD COLUMN lane_keys text[],
    ADD COLUMN lanes integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT ck_agent_action_lane_intake_lanes
        CHECK ((lane_key IS NULL) <> (lane_keys IS NULL));

CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    bad record;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(
                hashtextextended('outbox kind ' || current_schema() || '.' || k.kind, 0)),
            pg_notify('outbox_' || current_schema(), '')
       FROM (SELECT DISTINCT n.kind FROM new_actions n ORDER BY n.kind) k;
    SELECT n.id, n.kind, n.state, n.epoch, n.attempt, k.name IS NOT NULL AS known INTO bad
      FROM new_actions n
      LEFT JOIN agent_action_kind k ON k.name = n.kind
     WHERE k.name IS NULL
        OR n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
        OR (n.workspace_id IS NULL AND NOT k.instance_level)
     ORDER BY k.name IS NULL DESC, n.id
     LIMIT 1;
    IF FOUND THEN
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
    INSERT INTO agent_action_lane_intake (lane_key, lane_keys, lanes, priority)
    SELECT CASE WHEN count(*) = 1 THEN min(l.lane_key) END,
           CASE WHEN count(*) > 1 THEN array_agg(l.lane_key ORDER BY l.priority DESC) END,
           count(*), max(l.priority)
      FROM (SELECT n.lane_key, max(n.priority) AS priority
              FROM new_actions n GROUP BY n.lane_key) l
    HAVING count(*) > 0;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION agent_action_lane_intake(p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch bigint[];
    takes integer[];
    keys text[];
    holds timestamptz[];
    fresh text[];
    folded text[] := '{}';
    skipped text[];
    taken integer;
    lane record;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2831, hashtext(current_schema())) THEN
        RETURN 0;
    END IF;
    -- The rows this fold takes from, and how many of each row's lanes (a prefix).
    SELECT array_agg(t.seq), array_agg(t.take) INTO batch, takes
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
                    -- The newest too: a small transaction that committed after a newsletter's
                    -- is not left behind its 100,000 lanes (fairness, and the latency of a
                    -- single send).
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

    SELECT sum(t) INTO taken FROM unnest(takes) AS t;
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

    -- Some lanes' rows were held (by a finish): their entries stay for the next claim.
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
