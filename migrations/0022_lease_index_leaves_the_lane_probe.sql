-- 0022: a lane's executing action is found through ux_agent_action_lane_executing, never by a
-- scan of every executing action.
--
-- ix_agent_action_lease (lease_until) and ux_agent_action_lane_executing (lane_key) had the same
-- predicate, state = 'EXECUTING', so a probe for a lane's executing action (lane_key = $1 AND
-- state = 'EXECUTING': the fold's, the lane tracker's, the lane refresh's) could be planned on
-- either. A generic plan made while the tables were small costs both alike, and one made on the
-- lease index reads every executing action's entry (those of ended actions too, until vacuum)
-- to filter on the lane: a fold of 6,280 fresh lanes beside 608 such entries took 0.4 s where a
-- probe a lane takes 10 ms, and a claimer whose rounds fold before they claim fell to a third
-- of its pace under a backlog. The lease index now also requires lease_until IS NOT NULL (every
-- executing action has a lease, the row rules say so): what reads it by lease time (a lost
-- lease, a reclaim, the in-flight counts) compares lease_until, which implies that; a lane probe
-- does not, so it can only use the lane index. Rebuilding the index reads the table once under
-- a SHARE lock (enqueues wait meanwhile): seconds on a table of millions of rows.

DROP INDEX ix_agent_action_lease;
CREATE INDEX ix_agent_action_lease ON agent_action (lease_until)
    WHERE state = 'EXECUTING' AND lease_until IS NOT NULL;
