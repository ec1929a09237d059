-- 0004: the row triggers run only when they can change or refuse something.
--
-- Every plpgsql call with `SET search_path FROM CURRENT` costs a GUC save and restore besides the
-- call itself (about 25 us a row on the benchmark machine, half of it the SET). An action's life
-- updates its row five times (claim, take, fence, finish and the enqueue's insert), and the take
-- and the fence change only taken_epoch or write_started_at of an EXECUTING row: nothing either
-- trigger checks or tracks. WHEN clauses, evaluated without a function call, now keep those
-- updates out of both functions; the functions themselves are unchanged, so what they refuse and
-- how they keep the lane rows is the same.

-- The guard runs when the row has ended (always refused), or when anything it checks changes:
-- the state, the epoch, or an identity column.
DROP TRIGGER guard_agent_action ON agent_action;
CREATE TRIGGER guard_agent_action
    BEFORE INSERT ON agent_action
    FOR EACH ROW EXECUTE FUNCTION guard_agent_action();
CREATE TRIGGER guard_agent_action_update
    BEFORE UPDATE ON agent_action
    FOR EACH ROW
    WHEN (OLD.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED')
          OR NEW.state IS DISTINCT FROM OLD.state
          OR NEW.epoch IS DISTINCT FROM OLD.epoch
          OR (NEW.id, NEW.kind, NEW.lane_key, NEW.idempotency_key, NEW.workspace_id, NEW.created_at)
             IS DISTINCT FROM
             (OLD.id, OLD.kind, OLD.lane_key, OLD.idempotency_key, OLD.workspace_id, OLD.created_at))
    EXECUTE FUNCTION guard_agent_action();

-- The lane tracker: every insert; an update only when it moves a lane (a change of state, or of
-- a waiting action's due time), as the function's own first test says; a delete of a live action.
DROP TRIGGER agent_action_lane_track ON agent_action;
CREATE TRIGGER agent_action_lane_track
    AFTER INSERT ON agent_action
    FOR EACH ROW EXECUTE FUNCTION agent_action_lane_track();
CREATE TRIGGER agent_action_lane_track_update
    AFTER UPDATE ON agent_action
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state
          OR (NEW.state = 'ADMITTED' AND NEW.available_at IS DISTINCT FROM OLD.available_at))
    EXECUTE FUNCTION agent_action_lane_track();
CREATE TRIGGER agent_action_lane_track_delete
    AFTER DELETE ON agent_action
    FOR EACH ROW
    WHEN (OLD.state IN ('PROPOSED', 'ADMITTED', 'EXECUTING'))
    EXECUTE FUNCTION agent_action_lane_track();

-- The lane refresh is called only by agent_action_lane_track, which already runs on the
-- outbox's search_path: its own SET was a second save and restore a call.
ALTER FUNCTION agent_action_lane_refresh(text) RESET search_path;
