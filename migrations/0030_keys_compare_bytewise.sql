-- 0030: the outbox's keys compare byte by byte (COLLATE "C"), whatever the database's collation.
--
-- Every probe of a btree index on a text column compares its keys under the column's collation.
-- Under a database's linguistic collation (en_US.UTF-8, an ICU locale, even C.UTF-8) that is a
-- call into the locale's comparison for every step of every descent, where "C" compares bytes.
-- The outbox's keys (kinds, lanes, idempotency keys, workspaces, limit keys, subjects, rate
-- buckets) are identifiers: only their equality matters, and for the fair walk over limit keys
-- some one order. Measured, in-process drains of 30,000 actions taken in turns with the
-- columns before and after (medians of 6 and of 4): on a database of collation C.UTF-8, 6,776 ->
-- 7,194 actions/s and PostgreSQL's CPU 0.142 -> 0.134 ms an action; on one whose default
-- collation is ICU's en-US, 6,354 -> 6,956 actions/s and 0.153 -> 0.134 ms.
--
-- What a reader sees change: lists ordered by these columns (kinds, lanes) come in byte order
-- (upper case before lower case, accented letters after z), no longer in the database's.
--
-- No table is rewritten (the type stays text), but every index on these columns is rebuilt, with
-- the tables locked meanwhile (ACCESS EXCLUSIVE): enqueues, claims and attempts wait until the
-- migration commits. Measured here: 2.4 s for an agent_action of 1,000,000 waiting actions.
-- Run it when the outbox is quiet, or after housekeeping has pruned what retention lets go.

ALTER TABLE agent_action
    ALTER COLUMN kind TYPE text COLLATE "C",
    ALTER COLUMN lane_key TYPE text COLLATE "C",
    ALTER COLUMN idempotency_key TYPE text COLLATE "C",
    ALTER COLUMN workspace_id TYPE text COLLATE "C",
    ALTER COLUMN limit_key TYPE text COLLATE "C",
    ALTER COLUMN subject_account_id TYPE text COLLATE "C";

ALTER TABLE agent_action_lane
    ALTER COLUMN lane_key TYPE text COLLATE "C",
    ALTER COLUMN head_kind TYPE text COLLATE "C",
    ALTER COLUMN head_limit_key TYPE text COLLATE "C";

ALTER TABLE agent_action_lane_intake
    ALTER COLUMN lane_key TYPE text COLLATE "C",
    ALTER COLUMN lane_keys TYPE text[] COLLATE "C";

ALTER TABLE agent_action_kind_pause ALTER COLUMN kind TYPE text COLLATE "C";
ALTER TABLE agent_action_rate ALTER COLUMN bucket TYPE text COLLATE "C";

-- The kind's name: its rename trigger's condition reads the column, so it is made again.
DROP TRIGGER agent_action_kind_renamed ON agent_action_kind;
ALTER TABLE agent_action_kind ALTER COLUMN name TYPE text COLLATE "C";
CREATE TRIGGER agent_action_kind_renamed
    BEFORE UPDATE ON agent_action_kind
    FOR EACH ROW WHEN (NEW.name IS DISTINCT FROM OLD.name)
    EXECUTE FUNCTION agent_action_kind_in_use();
