-- 0002: one delivery per epoch for the Dramatiq dispatch.
--
-- A broker delivers at least once: the same (action_id, epoch) message can reach two workers at
-- once (a redelivery while the first worker still runs it). The epoch fences off older claims,
-- not a twin of the same claim, so the worker that takes a message first records the epoch it
-- took here (query take_attempt), and a second delivery of that epoch is dropped as Abandoned.
ALTER TABLE agent_action ADD COLUMN taken_epoch bigint;
