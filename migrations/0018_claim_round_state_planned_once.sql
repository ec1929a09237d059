-- 0018: a claim round's first look is one function call, its query planned once a session.
--
-- The claimer sends its opening query (BEGIN, the bounds and the claim lock, the first look) as
-- one simple-protocol query, so that it ends with the server ready (outbox/dispatch/
-- claim_guard.py). A simple query is planned every time it runs: the first look (the fold, the
-- paused kinds, the counts, the kinds with a head waiting) took about 0.17 ms of planning a
-- round, beside 0.5 ms of execution (pg_stat_statements, one round an action at 100 actions/s).
-- As a PL/pgSQL function, its query is planned once a session and kept; the round's query plans
-- only the call. It is the same query: the counts read a snapshot taken after the claim lock was
-- granted (the round's earlier statement took it), and agent_action_kinds_waiting, a function
-- of its own, sees the heads the fold wrote. Its parameters only feed the two functions it calls,
-- so the one plan it keeps is the generic one, made at its first call.
CREATE FUNCTION agent_action_claim_round_state(
    p_limit integer, p_kinds text[],
    OUT folded integer, OUT paused text[], OUT executing json, OUT waiting text[])
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    SELECT agent_action_lane_intake(p_limit),
           (SELECT coalesce(array_agg(p.kind), '{}') FROM agent_action_kind_pause p),
           (SELECT coalesce(json_agg(e), '[]')
              FROM (SELECT a.kind,
                           count(*) FILTER (WHERE a.lease_until > now()) AS n,
                           count(*) FILTER (WHERE a.lease_until <= now()
                                              AND a.taken_epoch IS DISTINCT FROM a.epoch)
                               AS unconsumed,
                           count(*) FILTER (WHERE a.lease_until <= now()) AS expired
                      FROM agent_action a
                     WHERE a.state = 'EXECUTING'
                     GROUP BY a.kind) e),
           agent_action_kinds_waiting(p_kinds)
      INTO folded, paused, executing, waiting;
END;
$$;
