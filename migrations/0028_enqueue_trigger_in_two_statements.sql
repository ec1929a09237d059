-- 0028: an enqueue's insert trigger does the same work for less.
--
-- The trigger runs once an insert statement, so on a one-action enqueue it is paid once an
-- action; it was a third of such an enqueue's server time. Two things in it cost more than
-- they did: its `SET search_path` (a function's SET makes PostgreSQL set and restore the path
-- and recompute its schema list at every call, about 12 us), and one statement more than the
-- common case needs. So:
--
-- - The function carries no SET clause: the schema's name is written into its body when this
--   migration runs (tables and functions qualified with it, the lock's key and the NOTIFY
--   channel spelled with it), so it resolves nothing through the caller's search_path but
--   PostgreSQL's own functions and operators (pg_catalog comes first unless a role puts it
--   later on purpose).
-- - The statement that reads the batch also takes the kind's shared lock (when the batch has
--   one kind) and sends the wake-up; a batch of one kind and one lane then needs one statement
--   more, which writes its intake row only if its kind accepts the batch. That statement comes
--   after the lock's, so its read sees what a deletion of the kind committed meanwhile (as in
--   0010). Every other batch, and every refusal, takes the paths of 0027 unchanged.
--
-- What the trigger accepts, refuses (and with which error), locks, notifies and writes is as
-- in 0027, outbox.enqueue_notify included.

DO $migration$
BEGIN
    EXECUTE replace(replace($function$
CREATE OR REPLACE FUNCTION agent_action_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
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
                   OR @schema@.agent_action_broken_check(n) IS NOT NULL) AS broken,
           CASE WHEN min(n.kind) = max(n.kind) THEN
               pg_advisory_xact_lock_shared(
                   hashtextextended('outbox kind ' || @name@ || '.' || min(n.kind), 0))
           END AS kind_locked,
           -- Off only when the setting spells off: any other value (a typo included) keeps
           -- the wake-up, and never fails the application's insert.
           CASE WHEN count(*) > 0 AND NOT @schema@.agent_action_notify_off(
                                              current_setting('outbox.enqueue_notify', true))
               THEN pg_notify('outbox_' || @name@, '')
           END AS woke
      INTO batch
      FROM new_actions n;
    IF batch.actions = 0 THEN
        RETURN NULL;
    END IF;
    IF batch.kind = batch.last_kind AND batch.lane_key = batch.last_lane_key
       AND NOT batch.broken THEN
        INSERT INTO @schema@.agent_action_lane_intake (lane_key, priority)
        SELECT batch.lane_key, batch.priority
          FROM @schema@.agent_action_kind k
         WHERE k.name = batch.kind AND (k.instance_level OR NOT batch.without_workspace);
        IF FOUND THEN
            RETURN NULL;
        END IF;
        accepted := false;
    ELSIF batch.kind = batch.last_kind THEN
        SELECT k.instance_level INTO instance_level
          FROM @schema@.agent_action_kind k WHERE k.name = batch.kind;
        accepted := FOUND AND NOT batch.broken
                    AND (instance_level OR NOT batch.without_workspace);
    ELSE
        PERFORM pg_advisory_xact_lock_shared(
                    hashtextextended('outbox kind ' || @name@ || '.' || k.kind, 0))
           FROM (SELECT DISTINCT n.kind FROM new_actions n ORDER BY n.kind) k;
        accepted := NOT batch.broken AND NOT EXISTS (
            SELECT 1 FROM new_actions n
              LEFT JOIN @schema@.agent_action_kind k ON k.name = n.kind
             WHERE k.name IS NULL OR (n.workspace_id IS NULL AND NOT k.instance_level));
    END IF;
    IF NOT accepted THEN
        SELECT n.id, n.kind, n.state, n.epoch, n.attempt, k.name IS NOT NULL AS known INTO bad
          FROM new_actions n
          LEFT JOIN @schema@.agent_action_kind k ON k.name = n.kind
         WHERE k.name IS NULL
            OR n.state NOT IN ('PROPOSED', 'ADMITTED') OR n.epoch <> 0 OR n.attempt <> 0
            OR (n.workspace_id IS NULL AND NOT k.instance_level)
            OR @schema@.agent_action_broken_check(n) IS NOT NULL
         ORDER BY k.name IS NULL DESC, n.id
         LIMIT 1;
        -- The row's rules first: the constraints ran before the trigger did.
        PERFORM @schema@.agent_action_refuse_broken(a)
           FROM @schema@.agent_action a WHERE a.id = bad.id;
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
        INSERT INTO @schema@.agent_action_lane_intake (lane_key, priority)
        VALUES (batch.lane_key, batch.priority);
    ELSE
        INSERT INTO @schema@.agent_action_lane_intake (lane_keys, lanes, priority)
        SELECT array_agg(l.lane_key ORDER BY l.priority DESC), count(*), max(l.priority)
          FROM (SELECT n.lane_key, max(n.priority) AS priority
                  FROM new_actions n GROUP BY n.lane_key) l;
    END IF;
    RETURN NULL;
END;
$$
$function$, '@schema@', quote_ident(current_schema())), '@name@', quote_literal(current_schema()));
END;
$migration$;
