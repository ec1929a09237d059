-- 0026: a worker's take names the worker process that took it, so that the attempts of a worker
-- killed before their fence can be given back without waiting for their lease.
--
-- A worker takes an action (the attempt counts from here), then passes its fence right before
-- the provider call. Killed in between (SIGKILL, an OOM kill, its machine gone), it leaves
-- attempts no process will finish: EXECUTING and taken, until their lease ends (5 minutes by
-- default) and a claimer reclaims them. taken_by holds the worker's heartbeat process id
-- (outbox_process.process_id); a claimer's housekeeping gives back the taken, unfenced attempts
-- of a worker whose heartbeat stopped (release_attempts_of_lost_workers), as a lease's end would,
-- only sooner. A claim that is its own take (in process) names no worker.
--
-- A column without a default: adding it changes the catalog only, whatever the table's size.

ALTER TABLE agent_action ADD COLUMN taken_by text;
