-- 0029: a payload is compressed with lz4 where the server has it, not with pglz.
--
-- A row whose payload makes it larger than about 2 KB has the payload compressed when it is
-- written (TOAST): by the enqueue, on the application's write path. PostgreSQL's default
-- method, pglz, was most of what a large payload cost the enqueue: for 100 actions of 8 KiB of
-- English text a call (`enqueue_many`), the server spent 0.27-0.35 ms of CPU an action with
-- pglz and 0.11-0.17 with lz4 (the whole call 0.44-0.49 ms an action against 0.28-0.35 ms);
-- reading them back cost the same (0.08-0.09 ms). lz4 compresses less: such a payload takes
-- 4,970 bytes against pglz's 3,550. An action keeps its payload only while it waits and runs
-- (an ended action keeps none; a parked copy waits for an operator's decision), so the
-- difference is held for minutes, not for the retention.
--
-- Only the values written from now on: the rows already there keep what they were written
-- with, and read as before. A server built without lz4, or older than PostgreSQL 14, keeps
-- pglz, and nothing else changes.

DO $migration$
BEGIN
    IF current_setting('server_version_num')::int >= 140000
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_settings
                    WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        -- A string, so that a server without the clause never parses it.
        EXECUTE 'ALTER TABLE agent_action ALTER COLUMN payload SET COMPRESSION lz4';
    END IF;
END;
$migration$;
