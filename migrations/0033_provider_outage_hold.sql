-- 0033: a kind whose provider is down is held: no claim takes its actions for a while.
--
-- Since 0032 an outage costs no action, but the down provider was still called once an action a
-- backoff: every new action's first attempts (1, 2, 4, 8 s apart at the defaults) and every
-- waiting action's ride-out, about four calls an action that met a 100-s outage. Now, once the
-- kind counts as down (OUTBOX_OUTAGE_THRESHOLD distinct actions retried since its last DONE),
-- its row holds it until `held_until`: claims skip the kind as they skip a paused one (the
-- claim round's `paused` names both, and the lane hand-off hands nothing on), so its actions
-- wait without spending attempts. When the hold ends, claims take the kind's due actions again:
-- a DONE among them ends the outage (and the hold), another retry holds it again, each hold
-- twice the last (`holds` counts them) up to a ceiling (outbox/provider_outage.py). A DONE of
-- the kind empties the row, hold included.

ALTER TABLE agent_action_kind_outage
    ADD COLUMN held_until timestamptz,
    ADD COLUMN holds integer NOT NULL DEFAULT 0;

-- Every claim round reads the held kinds (`held_until > now()`) under enable_seqscan off
-- (claim_round_guard, lane_intake): this index is how, a table of few rows or none.
CREATE INDEX ix_agent_action_kind_outage_held ON agent_action_kind_outage (held_until)
    WHERE held_until IS NOT NULL;

CREATE OR REPLACE FUNCTION agent_action_claim_round_state(
    p_limit integer, p_kinds text[],
    OUT folded integer, OUT paused text[], OUT executing json, OUT waiting text[],
    OUT next_due_in double precision)
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    folded := agent_action_lane_intake(p_limit);
    SELECT (SELECT coalesce(array_agg(s.kind), '{}')
              FROM (SELECT p.kind FROM agent_action_kind_pause p
                    UNION
                    SELECT o.kind FROM agent_action_kind_outage o
                     WHERE o.held_until > now()) s),
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
           agent_action_kinds_waiting(p_kinds),
           -- One probe of ix_agent_action_lane_scheduled_kind a kind: its first entry.
           (SELECT extract(epoch FROM min(n.due) - clock_timestamp())::double precision
              FROM unnest(p_kinds) AS k(kind)
             CROSS JOIN LATERAL (
                   SELECT s.head_due_at AS due
                     FROM agent_action_lane s
                    WHERE s.head_scheduled AND s.head_kind = k.kind
                    ORDER BY s.head_due_at
                    LIMIT 1) n)
      INTO paused, executing, waiting, next_due_in;
END;
$$;
