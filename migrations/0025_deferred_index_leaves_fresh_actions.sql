-- 0025: an action due at its enqueue enters no index by its due time.
--
-- ix_agent_action_due (kind, available_at) held every admitted action, so each enqueue wrote
-- an entry there beside the primary key, the idempotency key and the lane index: about a
-- twentieth of enqueue_many's time at 1,000 actions a call, for the sake of two operator
-- reads. The index that replaces it, ix_agent_action_deferred, holds only admitted actions
-- whose due time was moved past their creation (a not_before, a retry's back-off, a deferral, a
-- give-back): the enqueue of an action due now writes nothing to it. The limits view's waits
-- (waits_by_kind: due later) read it as before, since what is due later was deferred; the
-- backlog's due count (backlog_by_kind) reads the waiting actions through
-- ix_agent_action_lane_waiting instead, work in the number of waiting actions where it was in
-- the number of due ones (the same when little is scheduled ahead). The claim never read
-- either index: it reads the lane table. Building the index reads the table once under a SHARE
-- lock (enqueues wait meanwhile): seconds on a table of millions of rows.

DROP INDEX ix_agent_action_due;
CREATE INDEX ix_agent_action_deferred ON agent_action (kind, available_at)
    WHERE state = 'ADMITTED' AND available_at > created_at;
