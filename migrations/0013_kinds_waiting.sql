-- 0013: which kinds have a lane head waiting, so a dispatch claim round sends claim statements
-- only for those (and for kinds whose leases ran out).
--
-- A round ran a reclaim, a limit-key walk and a head claim for every kind its claimer serves,
-- whether or not anything of the kind waited: three round trips a kind, every round, so an
-- application with eight kinds paid twenty-four statements to claim one action of one kind.
-- claim_round_state now asks this function in the statement that folds the lane intake. It is
-- VOLATILE on purpose: a volatile function's query takes a snapshot of its own, so it sees the
-- lane heads that the fold (earlier in the same statement) just made; a query of the calling
-- statement would not.

CREATE FUNCTION agent_action_kinds_waiting(p_kinds text[]) RETURNS text[]
    LANGUAGE sql VOLATILE
    SET search_path FROM CURRENT
AS $$
    -- One probe of ix_agent_action_lane_ready a kind: its first entry, due or scheduled.
    SELECT coalesce(array_agg(k.kind), '{}')
      FROM unnest(p_kinds) AS k(kind)
     WHERE EXISTS (SELECT 1 FROM agent_action_lane l
                    WHERE l.head_kind = k.kind
                      AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL)
$$;
