-- 0032: a kind's provider outage, so that actions ride it out instead of spending their attempts.
--
-- An adapter answers `Retry` when its provider proved it holds nothing (a refused connection, a
-- 5xx before anything was accepted), and each such attempt counts: at the defaults (5 attempts,
-- a 5-s base) an action rides out 37.5 to 75 s of an outage alone, and a longer one failed
-- every action that met its start. Now a row a kind counts its retries: the distinct actions
-- (`retried`, up to 16 ids) whose attempts ended `Retry` since the kind's last DONE, and when
-- the first of them ended (`since`). A DONE of the kind empties the row (the provider
-- answered). While `retried` holds `OUTBOX_OUTAGE_THRESHOLD` actions or more
-- (and `since` is younger than `OUTBOX_OUTAGE_LIMIT_SECONDS`), the provider counts as down: an
-- attempt that would otherwise end FAILED `ATTEMPTS_EXHAUSTED` gives its attempt back and
-- waits its last backoff again (outbox/provider_outage.py).
--
-- Distinct actions, so that one action that always retries (bad input an adapter answers with
-- `Retry`) never opens an outage for its kind. The row is written after a finish statement
-- that ended an attempt with `Retry`, or a DONE of a kind whose row is not empty
-- (`provider_outage_note`): the finish of a kind whose provider answers reads an empty table.

CREATE TABLE agent_action_kind_outage (
    kind text COLLATE "C" PRIMARY KEY REFERENCES agent_action_kind (name) ON DELETE CASCADE,
    since timestamptz,
    retried bigint[] NOT NULL DEFAULT '{}',
    CHECK ((since IS NULL) = (cardinality(retried) = 0))
);
