-- 0010: an insert holds its kinds with a shared advisory lock, not a row lock on the kind.
--
-- agent_action_inserted (0009) locked each kind of the statement's new actions FOR KEY SHARE, so
-- that a kind could not be deleted or renamed under an enqueue that had not committed yet. A row
-- lock writes the kind's tuple (and a WAL record) on every insert statement, and concurrent
-- enqueuers of one kind share it through a MultiXact: about a fifth of a single-row enqueue's
-- statement time on the server (docs/benchmarks.md). The same exclusion now rests on a
-- transaction-level advisory lock a kind (in memory only): an insert takes it shared, a deletion
-- or a rename of the kind takes it exclusive before it looks for actions of the kind. So a
-- deletion waits for every transaction that inserted actions of the kind to end, then sees
-- their rows; an insert that comes after a deletion took the lock waits for it to end, then
-- finds the kind gone and is refused (the foreign key's error, as before).
--
-- The lock is taken in the statement before the one that reads the kind table, so that read
-- sees what a deletion committed while the insert waited. The NOTIFY rides in that statement:
-- an insert that is refused rolls it back with everything else, and an insert of no rows (every
-- key existed) wakes nobody.

-- The lock's key is a hash of the schema and the kind's name (advisory locks are database-wide);
-- two kinds whose keys collide only wait on each other's deletion, never pass it.
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
    INSERT INTO agent_action_lane_intake (lane_key, priority)
    SELECT n.lane_key, max(n.priority) FROM new_actions n GROUP BY n.lane_key;
    RETURN NULL;
END;
$$;

-- A kind that actions name is neither deleted nor renamed, as in 0009; the exclusive lock first,
-- then the look for its actions in a statement of its own (a fresh snapshot, after the wait).
CREATE OR REPLACE FUNCTION agent_action_kind_in_use() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('outbox kind ' || current_schema() || '.' || OLD.name, 0));
    IF EXISTS (SELECT 1 FROM agent_action a WHERE a.kind = OLD.name) THEN
        RAISE EXCEPTION 'update or delete on table "agent_action_kind" violates foreign key constraint "agent_action_kind_fkey" on table "agent_action"'
            USING ERRCODE = 'foreign_key_violation', TABLE = 'agent_action_kind',
                  CONSTRAINT = 'agent_action_kind_fkey',
                  DETAIL = format('Key (name)=(%s) is still referenced from table "agent_action".',
                                  OLD.name);
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END;
$$;
