-- 0034: a claimer judges another process lost only while its own heartbeat is unbroken.
--
-- A claimer gives back the untaken claims of a claimer, and the unfenced attempts of a worker,
-- whose heartbeat has been silent for three heartbeat intervals. A database outage longer than
-- that (a failover, a long restart) silences every process at once, the live ones too, and the
-- first claimer back gave back the live workers' attempts, each at the cost of an attempt. Each
-- heartbeat now keeps `beating_since`: the first beat of its unbroken run (each beat written
-- within 1.5 intervals of the one before, outbox/dispatch/heartbeat.py). A silence counts only
-- while the judging claimer's run has lasted as long, which an outage breaks: the live
-- processes have beaten again by the time it could judge them.

-- No default: a row keeps NULL until its process beats again (instant, no table rewrite).
ALTER TABLE outbox_process ADD COLUMN beating_since timestamptz;

-- Whether the claimer `p_claimer` may call a silence of `p_silent` another process's own: its
-- last beat is at most `p_gap` old, and its unbroken run of beats began at least `p_silent` ago.
-- The one rule of release_claims_of_lost_claimers and release_attempts_of_lost_workers, decided
-- on the database's clock as their statement runs (a give-back that waited through an outage
-- for its connection finds the claimer's run broken).
CREATE FUNCTION outbox_claimer_may_judge(p_claimer text, p_silent interval, p_gap interval)
RETURNS boolean
LANGUAGE sql STABLE SET search_path FROM CURRENT
AS $$
    SELECT EXISTS (
        SELECT 1 FROM outbox_process
         WHERE process_id = p_claimer
           AND last_seen >= now() - p_gap
           AND beating_since <= now() - p_silent)
$$;
