-- 0024: a claim names the claimer that made it, so that the claims of a claimer killed between
-- its claim's commit and its push can be given back without waiting for their lease.
--
-- A claimer commits its claims and then pushes them. Killed in between (SIGKILL, an OOM kill,
-- its machine gone), it leaves claims whose messages no broker holds: EXECUTING, untaken, and
-- counted in flight until their lease ends (5 minutes by default), when they are unconsumed and
-- stall their kind for a probe. claimed_by holds the claimer's heartbeat process id
-- (outbox_process.process_id); a claimer's housekeeping gives back the untaken claims of a
-- claimer whose heartbeat stopped (release_claims_of_lost_claimers). An in-process claim is its
-- own take and names no claimer.
--
-- A column without a default: adding it changes the catalog only, whatever the table's size.

ALTER TABLE agent_action ADD COLUMN claimed_by text;
