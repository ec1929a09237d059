-- Every statement the outbox runs on agent_action, one per `-- name:` header, with a one-line
-- description under it. `{schema}` is replaced by the quoted schema name once, at load time
-- (outbox/queries.py); parameters are psycopg's %(name)s. The DDL lives in migrations/.

-- name: enqueue
-- Insert an action unless its idempotency key exists; a racing insert of the same key waits for
-- the other transaction. Inserts nothing for an unknown kind, a missing workspace, or an
-- expires_at that has passed (enqueue_diagnose then says which).
INSERT INTO {schema}.agent_action
    (kind, state, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
     max_attempts, expires_at, available_at, priority, limit_key)
SELECT k.name, %(state)s, %(workspace_id)s, %(lane_key)s, %(idempotency_key)s, %(payload)s,
       %(subject_account_id)s, %(max_attempts)s, %(expires_at)s,
       greatest(%(not_before)s::timestamptz, now()), %(priority)s, %(limit_key)s
  FROM {schema}.agent_action_kind k
 WHERE k.name = %(kind)s
   AND (%(workspace_id)s::text IS NOT NULL OR k.instance_level)
   AND (%(expires_at)s::timestamptz IS NULL OR %(expires_at)s::timestamptz > now())
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, available_at, created_at

-- name: action_by_idempotency_key
-- The action that holds an idempotency key.
SELECT *, false AS created FROM {schema}.agent_action WHERE idempotency_key = %(idempotency_key)s

-- name: enqueue_diagnose
-- Why `enqueue` inserted nothing and found no earlier action.
SELECT (SELECT k.instance_level FROM {schema}.agent_action_kind k WHERE k.name = %(kind)s)
           AS instance_level,
       now() AS db_now

-- name: enqueue_many
-- Insert a batch of actions in request order (ids rise with it) in one statement, skipping keys
-- that exist (a racing insert of a key waits for the other transaction); inserts nothing at all
-- when any request with a new key is refused (enqueue_many_diagnose then says which). The batch
-- is one JSON object of columns, an array each, zipped in request order (a column left out, or
-- shorter, reads as nulls). Returns one row (none when nothing was inserted) of what the
-- database made, the caller has the rest:
-- the new ids and their keys in id order, each one's due time where it is not now() (a
-- not_before; null when none is), and now(), every new action's created_at. OFFSET 0 keeps the
-- document a value of its own: pulled up into a custom plan, it was folded into each column's
-- expression at planning time (14 ms of planning for 1,000 requests).
WITH request AS (
    SELECT r.kind, r.state, r.workspace_id, r.lane_key, r.idempotency_key, r.payload,
           r.subject_account_id, r.max_attempts::int AS max_attempts,
           r.expires_at::timestamptz AS expires_at, r.not_before::timestamptz AS not_before,
           r.priority::smallint AS priority, r.limit_key, r.ord,
           coalesce(k.name IS NOT NULL
                    AND (r.workspace_id IS NOT NULL OR k.instance_level)
                    AND (r.expires_at IS NULL OR r.expires_at::timestamptz > now()), false)
               AS accepted
      FROM (SELECT %(requests)s::text::jsonb AS d OFFSET 0) b
     CROSS JOIN ROWS FROM (
               jsonb_array_elements_text(b.d -> 'kind'),
               jsonb_array_elements_text(b.d -> 'state'),
               jsonb_array_elements_text(b.d -> 'workspace_id'),
               jsonb_array_elements_text(b.d -> 'lane_key'),
               jsonb_array_elements_text(b.d -> 'idempotency_key'),
               jsonb_array_elements(b.d -> 'payload'),
               jsonb_array_elements_text(b.d -> 'subject_account_id'),
               jsonb_array_elements_text(b.d -> 'max_attempts'),
               jsonb_array_elements_text(b.d -> 'expires_at'),
               jsonb_array_elements_text(b.d -> 'not_before'),
               jsonb_array_elements_text(b.d -> 'priority'),
               jsonb_array_elements_text(b.d -> 'limit_key'))
           WITH ORDINALITY AS r(kind, state, workspace_id, lane_key, idempotency_key, payload,
                                subject_account_id, max_attempts, expires_at, not_before,
                                priority, limit_key, ord)
      LEFT JOIN {schema}.agent_action_kind k ON k.name = r.kind
), inserted AS (
INSERT INTO {schema}.agent_action
    (kind, state, workspace_id, lane_key, idempotency_key, payload, subject_account_id,
     max_attempts, expires_at, available_at, priority, limit_key)
SELECT r.kind, r.state, r.workspace_id, r.lane_key, r.idempotency_key, r.payload,
       r.subject_account_id, r.max_attempts, r.expires_at, greatest(r.not_before, now()),
       r.priority, r.limit_key
  FROM request r
 WHERE r.accepted
   AND NOT EXISTS (
       SELECT 1 FROM request x
        WHERE NOT x.accepted
          AND NOT EXISTS (SELECT 1 FROM {schema}.agent_action a
                           WHERE a.idempotency_key = x.idempotency_key))
 ORDER BY r.ord
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id, idempotency_key, available_at
)
SELECT array_agg(i.id ORDER BY i.id) AS ids,
       array_agg(i.idempotency_key ORDER BY i.id) AS keys,
       CASE WHEN bool_or(i.available_at <> now())
            THEN array_agg(nullif(i.available_at, now()) ORDER BY i.id) END AS later,
       now() AS created_at
  FROM inserted i
HAVING count(*) > 0

-- name: actions_by_idempotency_keys
-- The actions that hold any of a list of idempotency keys.
SELECT *, false AS created FROM {schema}.agent_action
 WHERE idempotency_key = ANY(%(idempotency_keys)s::text[])

-- name: enqueue_many_diagnose
-- Why `enqueue_many` inserted nothing for some keys and found no earlier actions: each kind's
-- instance_level (NULL when unknown) and the database clock.
SELECT r.kind,
       (SELECT k.instance_level FROM {schema}.agent_action_kind k WHERE k.name = r.kind)
           AS instance_level,
       now() AS db_now
  FROM unnest(%(kinds)s::text[]) AS r(kind)

-- name: action_by_id
-- One action, whole.
SELECT *, false AS created FROM {schema}.agent_action WHERE id = %(id)s

-- name: admit
-- A proposal becomes ADMITTED and due now, or at its not_before if that is later.
UPDATE {schema}.agent_action SET state = 'ADMITTED', available_at = greatest(available_at, now())
 WHERE id = %(id)s AND state = 'PROPOSED'
RETURNING *, false AS created

-- name: refuse
-- A proposal ends CANCELLED with the refusal's reason.
UPDATE {schema}.agent_action
   SET state = 'CANCELLED', stop_reason = %(reason)s, payload = NULL, ended_at = now()
 WHERE id = %(id)s AND state = 'PROPOSED'
RETURNING *, false AS created

-- name: lane_intake
-- Folds up to `limit` lanes of the lane intake (what enqueues, admits, refusals, expiries and
-- erasures left) into the lane rows, before a claim reads them (function in migration 0015).
-- Never waits on a lane row; returns how many lanes it took, and the kinds not to claim now: an
-- operator paused them, or their provider's outage holds them (read here, in a statement every
-- claim runs anyway, so a pause costs the claim nothing).
-- It commits without waiting for its WAL flush (a claim round's transaction already does): a
-- fold that a server crash loses leaves the intake rows where they were, and the next claim
-- folds them again.
-- The in-process executor's claim runs it first in the claim's transaction, and the claim after
-- it is planned without sequential scans and never compiled (enable_seqscan and jit off, to the
-- transaction's end): the claim is prepared once a session, and a plan made while the lane
-- table had a page or two scanned the whole table for each limit key its walk probed, however
-- many lanes waited by then (every statement of a claim has an index to go by; a round's
-- statements take milliseconds, and a plan costly enough for JIT would spend most of a second
-- compiling). The claim is planned once a session, generically, as a claimer's
-- (claim_round_guard).
SELECT {schema}.agent_action_lane_intake(%(limit)s) AS folded,
       (SELECT coalesce(array_agg(s.kind), '{}')
          FROM (SELECT p.kind FROM {schema}.agent_action_kind_pause p
                UNION
                SELECT o.kind FROM {schema}.agent_action_kind_outage o
                 WHERE o.held_until > now()) s)
           AS paused
 WHERE (SELECT set_config('synchronous_commit', 'off', true)
               || set_config('enable_seqscan', 'off', true)
               || set_config('jit', 'off', true)
               || set_config('plan_cache_mode', 'force_generic_plan', true)) IS NOT NULL

-- name: claim_heads
-- Due, idle lane heads of one kind become EXECUTING under a lease: the epoch rises, the
-- attempt does not (a worker's take counts it). With `take` (an in-process executor that runs
-- what it claims) the claim is the take too, and returns the payload; without, the payload is
-- not read. Lanes and heads another transaction holds are skipped; a lane row is reached
-- through its own small index, never through the lane's backlog.
-- Fair and by priority, over limit keys (workspaces, unless the actions name others): `keys`,
-- or, when it is NULL, the walk below; of each key at most its share of due heads by
-- (priority, due time): `per_key`, or, when NULL, `limit` divided by the keys; fewer when the
-- key's concurrency cap (`key_cap`, NULL for none) leaves less room beside its executing
-- actions; then up to `limit` of them, each key's first before any key's second (round robin),
-- and by priority and due time within a round.
-- The walk: the keys that have due lane heads of the kind, up to `walk` of them, in key order
-- from the first after `after`, wrapping around once; one probe of ix_agent_action_lane_ready a
-- key (a skip scan), however many heads a key has. That index holds no lane whose head is
-- scheduled for later (the fold promotes it once due, 0031), so a key with only scheduled heads
-- is never walked; a key whose heads are all busy (an erased write's hold) still is. A key at
-- its cap (`key_cap`) is stepped over without counting toward `walk`, up to `steps` keys walked
-- in all: under a cap of one, most keys with due heads are running one, and a walk that counted
-- them reached a few keys with room a claim (in process, 1,400 against 1,600 actions/s over 200
-- keys at a 100 ms provider). A step costs about 10 us: `steps` bounds a claim that finds
-- every key at its cap (4.4 ms over 1,000 such keys, against 23 ms with no bound).
-- The probes after the wrap stop short of the first key, never reading it again: a probe steps
-- over every index entry of the key it finds that is not yet marked dead, and while a long
-- transaction elsewhere holds the vacuum horizon none is (one lane row an action run). It runs
-- in this statement (not one of its own) so that a claim is one round trip; its first row
-- carries the keys walked, those at their cap too (`walked`, for the caller's round robin;
-- NULL on the others: 32 keys on each of 100 rows were 3,200 strings to write and parse), and
-- whether a key took its whole share with room for more (`filled`: only then may a second
-- statement take more of the claim's room); a claim that found nothing returns one row of
-- NULLs with them.
-- Each claim names its claimer (`claimer`: its heartbeat process id; NULL in process), whose
-- untaken claims another claimer gives back once its heartbeat stops
-- (release_claims_of_lost_claimers), and names no worker (taken_by: a new epoch nobody took).
-- With `reclaim`, the kind's reclaims come first, in the same statement (one round trip a
-- claim): executing actions whose lease expired are claimed again at once, without waiting for
-- their lane, so a lane whose holder crashed does not stall; never an at-most-once action whose
-- write started, nor one whose last attempt ran (housekeeping ends those); a claim that no
-- worker took spent no attempt, whatever the count. Up to `limit` of them, and the heads fill
-- what they left; without `heads`, only the reclaims (a kind whose claims a stalled claimer
-- only probes): no key is walked and no head claimed.
-- It commits without waiting for its WAL flush, as take_attempt does (a claim round's
-- transaction already does): an in-process claim, which is also the take, is followed by the
-- attempt's fence, which commits synchronously and so flushes the claim first; a claim that a
-- server crash loses was followed by no write, and its action is due again. In process, where
-- claims take turns (a kind with a concurrency cap, outbox/rounds.py), an hour of slow flushes
-- would otherwise set every round's pace.
-- A kind an operator paused, or its provider's outage holds (0033), claims nothing, neither
-- reclaims nor heads (`paused`, one probe of each table's primary key): the in-process claim
-- sends its claims in the same round trip as the fold that reads them (Store.claim), so it
-- cannot leave such a kind out itself. Once a hold is over and until the outage ends, the kind
-- claims one action at a time, and only while none of it runs under a live lease (`paused.n`,
-- the claim's bound in place of `limit`): that action probes the provider; its DONE ends the
-- outage, its retry holds the kind again (outbox/provider_outage.py).
WITH RECURSIVE outage AS (
    SELECT o.held_until > now() AS held, o.holds > 0 AS probing
      FROM {schema}.agent_action_kind_outage o
     WHERE o.kind = %(kind)s
), paused AS (
    SELECT EXISTS (SELECT 1 FROM {schema}.agent_action_kind_pause p WHERE p.kind = %(kind)s)
           OR coalesce((SELECT held FROM outage), false) AS yes,
           CASE WHEN NOT coalesce((SELECT probing FROM outage), false) THEN %(limit)s::int
                WHEN EXISTS (SELECT 1 FROM {schema}.agent_action e
                              WHERE e.state = 'EXECUTING' AND e.kind = %(kind)s
                                AND e.lease_until > now()) THEN 0
                ELSE least(%(limit)s::int, 1) END AS n
), expired AS (
    SELECT a.id
      FROM {schema}.agent_action a
     WHERE %(reclaim)s AND NOT (SELECT yes FROM paused)
       AND a.state = 'EXECUTING'
       AND a.lease_until <= now()
       AND a.kind = %(kind)s
       AND (a.taken_epoch IS DISTINCT FROM a.epoch OR a.attempt < a.max_attempts)
       AND (a.write_started_at IS NULL OR EXISTS (
                SELECT 1 FROM {schema}.agent_action_kind k
                 WHERE k.name = a.kind AND NOT k.at_most_once))  -- a probe of the kind's row
     ORDER BY a.lease_until
     LIMIT (SELECT n FROM paused)
       FOR UPDATE SKIP LOCKED
), reclaimed AS (
    UPDATE {schema}.agent_action a
       SET epoch = a.epoch + 1, lease_until = now() + %(lease)s,
           attempt = a.attempt + %(take)s::int,
           taken_epoch = CASE WHEN %(take)s THEN a.epoch + 1 ELSE a.taken_epoch END,
           claimed_by = %(claimer)s::text, taken_by = NULL
      FROM expired
     WHERE a.id = expired.id
    RETURNING a.id, a.kind, a.state, a.workspace_id, a.lane_key, a.idempotency_key,
              CASE WHEN %(take)s THEN a.payload END AS payload, a.subject_account_id,
              a.max_attempts, a.expires_at, a.attempt, a.epoch, a.available_at, a.lease_until,
              a.write_started_at, a.earlier_write_at, a.readback_ref, a.stop_reason,
              a.retry_reason, a.created_at, a.ended_at, a.priority, a.limit_key,
              a.lease_until - now() AS lease_left
), room AS (
    SELECT CASE WHEN %(heads)s AND NOT (SELECT yes FROM paused)
                THEN (SELECT n FROM paused) - count(*)::int ELSE 0 END AS n
      FROM reclaimed
), executing AS (
    -- Under a key cap, each key's executing actions of the kind, counted in one pass over the
    -- executing rows (not once a key, nor once a candidate).
    SELECT coalesce(e.limit_key, e.workspace_id, '') AS k, count(*)::int AS n
      FROM {schema}.agent_action e
     WHERE %(key_cap)s::int IS NOT NULL
       AND e.state = 'EXECUTING' AND e.kind = %(kind)s
     GROUP BY 1
), capped AS (
    -- The keys at their cap: the walk steps over them without counting them toward `walk`,
    -- up to `steps` keys in all (so a claim among thousands of keys at their cap stops, and
    -- the next goes on after it).
    SELECT coalesce(array_agg(x.k), '{}'::text[]) AS keys
      FROM executing x
     WHERE x.n >= %(key_cap)s::int
), walk(k, p, d, first, i, n, c) AS (
    -- Each probe returns the key's first entry in the index (its priority and due time too):
    -- every entry before it is of a row this statement's snapshot does not see, so the key's
    -- heads below start there (candidates). `i` counts the keys walked, `n` those not at their
    -- cap (the walk's bound), `c` says the key is at its cap.
    SELECT s.k, s.p, s.d, s.k, 1, (s.k <> ALL (c.keys))::int, s.k = ANY (c.keys)
      FROM (SELECT y.k, y.p, y.d
              FROM ((SELECT l.head_limit_key AS k, l.head_priority AS p, l.head_due_at AS d
                       FROM {schema}.agent_action_lane l
                      WHERE l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                        AND NOT l.head_scheduled
                        AND l.head_kind = %(kind)s AND l.head_limit_key > %(after)s
                      ORDER BY l.head_limit_key, l.head_priority DESC, l.head_due_at LIMIT 1)
                    UNION ALL
                    (SELECT l.head_limit_key, l.head_priority, l.head_due_at
                       FROM {schema}.agent_action_lane l
                      WHERE l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                        AND NOT l.head_scheduled
                        AND l.head_kind = %(kind)s
                      ORDER BY l.head_limit_key, l.head_priority DESC, l.head_due_at LIMIT 1)) y
             LIMIT 1) s  -- the second probe runs only when the first found nothing
     CROSS JOIN capped c
     WHERE %(keys)s::text[] IS NULL AND %(heads)s AND NOT (SELECT yes FROM paused)
    UNION ALL
    SELECT x.k, x.p, x.d, w.first, w.i + 1, w.n + (x.k <> ALL (c.keys))::int, x.k = ANY (c.keys)
      FROM walk w
     CROSS JOIN capped c
     CROSS JOIN LATERAL (
           SELECT y.k, y.p, y.d
             FROM (-- Not wrapped yet: the next key.
                   (SELECT l.head_limit_key AS k, l.head_priority AS p, l.head_due_at AS d
                      FROM {schema}.agent_action_lane l
                     WHERE w.k >= w.first
                       AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                       AND NOT l.head_scheduled
                       AND l.head_kind = %(kind)s AND l.head_limit_key > w.k
                     ORDER BY l.head_limit_key, l.head_priority DESC, l.head_due_at LIMIT 1)
                   UNION ALL
                   -- Else wrap: the first key below the first.
                   (SELECT l.head_limit_key, l.head_priority, l.head_due_at
                      FROM {schema}.agent_action_lane l
                     WHERE w.k >= w.first
                       AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                       AND NOT l.head_scheduled
                       AND l.head_kind = %(kind)s AND l.head_limit_key < w.first
                     ORDER BY l.head_limit_key, l.head_priority DESC, l.head_due_at LIMIT 1)
                   UNION ALL
                   -- Wrapped: the next key short of the first.
                   (SELECT l.head_limit_key, l.head_priority, l.head_due_at
                      FROM {schema}.agent_action_lane l
                     WHERE w.k < w.first
                       AND l.executing_id IS NULL AND l.head_due_at IS NOT NULL
                       AND NOT l.head_scheduled
                       AND l.head_kind = %(kind)s AND l.head_limit_key > w.k
                       AND l.head_limit_key < w.first
                     ORDER BY l.head_limit_key, l.head_priority DESC, l.head_due_at LIMIT 1)) y
            LIMIT 1) x
     WHERE w.n < %(walk)s AND w.i < %(steps)s
), walked AS (
    -- Every key walked, those at their cap too (the caller's round robin goes on after the
    -- last), and those with room, which share the claim: each up to `share` of its heads
    -- (`per_key`, or the room divided between them).
    SELECT x.keys, x.open,
           coalesce(%(per_key)s::int,
                    ((SELECT n FROM room) + cardinality(x.open) - 1) / cardinality(x.open))
               AS share
      FROM (SELECT coalesce(%(keys)s::text[], (SELECT array_agg(w.k ORDER BY w.i) FROM walk w))
                       AS keys,
                   coalesce(%(keys)s::text[],
                            (SELECT array_agg(w.k ORDER BY w.i) FILTER (WHERE NOT w.c)
                               FROM walk w))
                       AS open) x
), keys AS (
    -- least() ignores the NULL of no cap. A key the caller named (`keys`) was not walked: its
    -- first entry (p, d) is NULL.
    SELECT u.k, u.ord, walked.share, w.p, w.d,
           least(walked.share, %(key_cap)s::int - coalesce(busy.n, 0)) AS room
      FROM walked
     CROSS JOIN LATERAL unnest(walked.open) WITH ORDINALITY AS u(k, ord)
      LEFT JOIN executing busy ON busy.k = u.k
      LEFT JOIN walk w ON w.k = u.k
), candidates AS (
    -- Each key's lane rows are locked as the scan finds them, skipping those another
    -- transaction holds: a claim beside another (in process, rounds may claim at once) takes
    -- the lanes after the ones the other locked, not the same candidates only to skip them.
    -- A row is rechecked as it is locked: a lane claimed meanwhile is passed over.
    -- A walked key's heads are read from the first entry the walk found of it on: those of its
    -- priority from its due time on, then those of lower priorities. The entries before it are
    -- of rows this statement does not see, and while a long transaction elsewhere holds the
    -- vacuum horizon no scan can mark them dead: a scan from the key's start would step over
    -- them all again (one lane row an action run).
    SELECT c.lane_key, c.head_id, c.head_priority, c.head_due_at, keys.ord, c.rn
      FROM keys
     CROSS JOIN LATERAL (
           SELECT x.*,
                  -- A ROWS frame: the default (RANGE) frame makes the window read every
                  -- head that ties on (priority, due time) before its first row, and a
                  -- batch enqueue gives a thousand lanes the same due time.
                  row_number() OVER (ORDER BY x.head_priority DESC, x.head_due_at
                                     ROWS UNBOUNDED PRECEDING) AS rn
             FROM (SELECT y.*
                     -- Each branch's lock in a subquery of its own (a lock may not be a
                     -- UNION's).
                     FROM ((SELECT a.* FROM (
                            SELECT l.lane_key, l.head_id, l.head_priority, l.head_due_at
                              FROM {schema}.agent_action_lane l
                             WHERE l.executing_id IS NULL
                               AND l.head_due_at IS NOT NULL
                               AND NOT l.head_scheduled
                               AND l.head_due_at <= now()
                               -- an erased write may still run
                               AND (l.busy_until IS NULL OR l.busy_until <= now())
                               AND l.head_kind = %(kind)s
                               AND l.head_limit_key = keys.k
                               AND l.head_priority = keys.p  -- none when not walked
                               AND l.head_due_at >= keys.d
                             ORDER BY l.head_due_at
                             LIMIT greatest(keys.room, 0)
                               FOR UPDATE OF l SKIP LOCKED) a)
                           UNION ALL
                           (SELECT b.* FROM (
                            SELECT l.lane_key, l.head_id, l.head_priority, l.head_due_at
                              FROM {schema}.agent_action_lane l
                             WHERE l.executing_id IS NULL
                               AND l.head_due_at IS NOT NULL
                               AND NOT l.head_scheduled
                               AND l.head_due_at <= now()
                               AND (l.busy_until IS NULL OR l.busy_until <= now())
                               AND l.head_kind = %(kind)s
                               AND l.head_limit_key = keys.k
                               -- every priority when not walked (they are -100 to 100)
                               AND l.head_priority < coalesce(keys.p, 32767)
                             ORDER BY l.head_priority DESC, l.head_due_at
                             LIMIT greatest(keys.room, 0)
                               FOR UPDATE OF l SKIP LOCKED) b)) y
                    LIMIT greatest(keys.room, 0)) x) c
     ORDER BY c.rn, c.head_priority DESC, c.head_due_at, keys.ord
     LIMIT (SELECT n FROM room)
), ready AS (
    -- One primary-key probe a candidate, locked in the probe: a join here was planned as a
    -- hash join over a scan of every admitted action once the candidates' row estimate grew
    -- (a lock in a lateral subquery is never turned into such a scan). The probe's tests are
    -- written `(...) IS TRUE`, which the planner cannot match to a partial index's predicate:
    -- planned while the statistics say the table is empty (a new outbox's first burst), a
    -- scan of the due actions looked as cheap as the probe, and ran once a candidate.
    SELECT h.id, h.tid
      FROM candidates c
     CROSS JOIN LATERAL (
           SELECT a.id, a.lane_key, a.ctid AS tid
             FROM {schema}.agent_action a
            WHERE a.id = c.head_id
              AND (a.state = 'ADMITTED') IS TRUE
              AND (a.expires_at IS NULL OR a.expires_at > now()) IS TRUE
              FOR UPDATE OF a SKIP LOCKED) h  -- a head an application's erasure holds is left
     -- The lane row may lag its intake (a concurrent transaction's earlier id committed after
     -- this head was folded): the head is its lane's first waiting action among what
     -- committed, found by one probe of ix_agent_action_lane_waiting (ordered by id, so a
     -- plan never reads the lane's, or every lane's, waiting actions to compare). A head
     -- that is not (locked above, claimed by nobody) stays locked until the claim commits.
     -- The update below follows the locked row version's tuple id (as take_attempts does), not
     -- a second probe of the primary key; a head that another transaction changed and
     -- committed after this statement began is locked in its new version, which the
     -- statement's snapshot does not see: it is left for the next claim, as a locked head is.
     CROSS JOIN LATERAL (
           SELECT b.id
             FROM {schema}.agent_action b
            WHERE b.lane_key = h.lane_key AND b.state IN ('PROPOSED', 'ADMITTED')
            ORDER BY b.id
            LIMIT 1) first
     WHERE first.id = h.id
), claimed AS (
    UPDATE {schema}.agent_action a
       SET state = 'EXECUTING', epoch = a.epoch + 1, lease_until = now() + %(lease)s,
           attempt = a.attempt + %(take)s::int,
           taken_epoch = CASE WHEN %(take)s THEN a.epoch + 1 ELSE a.taken_epoch END,
           claimed_by = %(claimer)s::text, taken_by = NULL
      FROM ready
     WHERE a.ctid = ready.tid
    RETURNING a.id, a.kind, a.state, a.workspace_id, a.lane_key, a.idempotency_key,
              CASE WHEN %(take)s THEN a.payload END AS payload, a.subject_account_id,
              a.max_attempts, a.expires_at, a.attempt, a.epoch, a.available_at, a.lease_until,
              a.write_started_at, a.earlier_write_at, a.readback_ref, a.stop_reason,
              a.retry_reason, a.created_at, a.ended_at, a.priority, a.limit_key,
              a.lease_until - now() AS lease_left
)
SELECT c.*, CASE WHEN row_number() OVER () = 1 THEN w.keys END AS walked,
       -- Whether a key took its whole share while its cap left it room for more: only then
       -- may a second statement over the keys walked take more of the room left (a key that
       -- took less had no more due heads; one bound by its cap has no room). Asked only of a
       -- claim over several keys with room: one key's share was the whole claim.
       CASE WHEN row_number() OVER () = 1 AND cardinality(w.open) > 1 THEN EXISTS (
                -- Each key's room as `keys` reckons it, from the CTEs the claim read already
                -- (not `keys` again: a second reference would materialize it).
                SELECT 1
                  FROM (SELECT coalesce(x.limit_key, x.workspace_id, '') AS k, count(*) AS n
                          FROM claimed x
                         GROUP BY 1) t
                  LEFT JOIN executing busy ON busy.k = t.k
                 WHERE t.n >= w.share
                   AND (%(key_cap)s::int IS NULL
                        OR %(key_cap)s::int - coalesce(busy.n, 0) >= w.share)) END AS filled
  FROM walked w
  LEFT JOIN (SELECT * FROM reclaimed UNION ALL SELECT * FROM claimed) c ON true
 WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL

-- name: end_lost_leases
-- Executing actions whose lease expired and that may not run again end: an at-most-once one
-- whose write started, or any whose last attempt was taken by a worker. UNCERTAIN when the write started (the effect
-- may exist), FAILED ATTEMPTS_EXHAUSTED when it provably did not.
WITH lost AS (
    SELECT a.id, a.write_started_at IS NOT NULL AS wrote
      FROM {schema}.agent_action a
      JOIN {schema}.agent_action_kind k ON k.name = a.kind
     WHERE a.state = 'EXECUTING'
       AND a.lease_until <= now()
       AND ((a.write_started_at IS NOT NULL AND k.at_most_once)
            OR (a.taken_epoch = a.epoch AND a.attempt >= a.max_attempts))
     ORDER BY a.lease_until
     LIMIT %(limit)s
       FOR UPDATE OF a SKIP LOCKED
), ended AS (
    UPDATE {schema}.agent_action a
       SET state = CASE WHEN lost.wrote THEN 'UNCERTAIN' ELSE 'FAILED' END,
           stop_reason = CASE WHEN lost.wrote THEN 'LEASE_LOST_AFTER_WRITE' ELSE 'ATTEMPTS_EXHAUSTED' END,
           payload = NULL, ended_at = now()
      FROM lost
     WHERE a.id = lost.id
    RETURNING a.id, a.epoch, a.kind, a.state, a.stop_reason, lost.wrote, a.write_started_at
), history AS (
    -- The lost attempt's row ends: its worker never finished it (LEASE_EXPIRED, or the write
    -- may have happened: LEASE_LOST_AFTER_WRITE), with its fence's time if it passed one.
    UPDATE {schema}.agent_action_attempt h
       SET ended_at = now(), result = e.state,
           fence_passed_at = coalesce(h.fence_passed_at, e.write_started_at),
           reason = CASE WHEN e.wrote THEN 'LEASE_LOST_AFTER_WRITE' ELSE 'LEASE_EXPIRED' END
      FROM ended e
     WHERE h.action_id = e.id AND h.epoch = e.epoch AND h.ended_at IS NULL
), parked AS (
    INSERT INTO {schema}.agent_action_parked_payload (action_id, payload)
    SELECT o.id, o.payload
      FROM ended e JOIN {schema}.agent_action o ON o.id = e.id
     WHERE o.payload IS NOT NULL
    ON CONFLICT (action_id) DO NOTHING
)
SELECT id, kind, state, stop_reason FROM ended

-- name: expire_waiting
-- Waiting actions past expires_at end CANCELLED EXPIRED.
WITH gone AS (
    SELECT a.id
      FROM {schema}.agent_action a
     WHERE a.state IN ('PROPOSED', 'ADMITTED') AND a.expires_at <= now()
     ORDER BY a.expires_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), expired AS (
    UPDATE {schema}.agent_action a
       SET state = 'CANCELLED', stop_reason = 'EXPIRED', payload = NULL, ended_at = now()
      FROM gone
     WHERE a.id = gone.id
    RETURNING a.id, a.kind, a.state, a.stop_reason
), parked AS (
    -- Kept for an operator's retry, as every end other than DONE.
    INSERT INTO {schema}.agent_action_parked_payload (action_id, payload)
    SELECT o.id, o.payload
      FROM expired e JOIN {schema}.agent_action o ON o.id = e.id
     WHERE o.payload IS NOT NULL
    ON CONFLICT (action_id) DO NOTHING
)
SELECT id, kind, state, stop_reason FROM expired

-- name: take_attempt
-- A worker takes the executing action a message names, once per epoch: nothing when the epoch
-- moved, the action ended or was erased, or another delivery of this epoch took it first. The
-- take is the run: it raises the attempt and starts the lease afresh (a message may have
-- waited in the broker for most of the claim's lease). The attempt's history row starts here:
-- the claim's time is its lease's start, read by the same probe that finds the row (`target`),
-- before the update moves the lease; the update then reaches the row by its tuple id, and
-- rechecks its conditions should a concurrent update have changed it since.
-- The take commits without waiting for its WAL flush (the set_config, evaluated once when a row
-- was taken: nothing to flush otherwise), as a claim round does: a
-- take that a server crash loses was followed by no fence (the fence is the next statement, on
-- the same server, and commits synchronously, flushing the take's WAL before it), so no write
-- began; the action is reclaimed as unconsumed and no attempt was spent.
-- The take names its worker (`taker`: the worker process's heartbeat process id; '' names none),
-- whose taken, unfenced attempts a claimer gives back once its heartbeat stops
-- (release_attempts_of_lost_workers).
WITH target AS (
    SELECT a.ctid AS tid, a.epoch, a.lease_until AS claim_lease_until
      FROM {schema}.agent_action a
     WHERE a.id = %(id)s AND a.epoch = %(epoch)s AND (a.state = 'EXECUTING') IS TRUE
       AND a.taken_epoch IS DISTINCT FROM a.epoch
), taken AS (
    UPDATE {schema}.agent_action a
       SET taken_epoch = a.epoch, attempt = a.attempt + 1, lease_until = now() + %(lease)s,
           taken_by = nullif(%(taker)s::text, '')
      FROM target
     WHERE a.ctid = target.tid AND a.epoch = target.epoch AND (a.state = 'EXECUTING') IS TRUE
       AND a.taken_epoch IS DISTINCT FROM a.epoch
    RETURNING a.*, a.lease_until - now() AS lease_left, target.claim_lease_until
), history AS (
    INSERT INTO {schema}.agent_action_attempt (action_id, epoch, attempt, claimed_at, taken_at)
    SELECT t.id, t.epoch, t.attempt, t.claim_lease_until - %(lease)s::interval, now()
      FROM taken t
    ON CONFLICT (action_id, epoch) DO NOTHING
), lost AS (
    -- A reclaimed action whose earlier attempt passed its fence and was lost (its worker
    -- killed): that attempt's row gets its fence's time, which the row still shows (the take
    -- leaves write_started_at as it is).
    UPDATE {schema}.agent_action_attempt h
       SET fence_passed_at = t.write_started_at
      FROM taken t
     WHERE t.write_started_at IS NOT NULL
       AND h.action_id = t.id AND h.epoch < t.epoch
       AND h.ended_at IS NULL AND h.fence_passed_at IS NULL
)
SELECT * FROM taken WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL

-- name: claim_lock
-- Serialises the dispatch claimers' bounded claims (count in flight, then claim) for one schema,
-- until the claiming transaction ends, so replicas together keep the in-flight bound.
SELECT pg_advisory_xact_lock(2830, hashtext(%(schema)s))

-- name: begin
-- Opens a transaction on an autocommit connection where psycopg's own would cost a round trip
-- of its own (a dispatch claim round sends it in one query with the round's first statements).
BEGIN

-- name: claim_round_guard
-- Opens a claim transaction with LOCAL bounds (how long it waits for the claim lock, runs one
-- statement, and sits idle between statements: past that the server ends the session, so a
-- claimer paused or cut off while it holds the lock frees it), then takes the claim lock (as
-- claim_lock, which then returns at once), so the claimer can time its wait. The settings come
-- first in the target list: the lock's wait already runs under the new lock_timeout.
-- The round commits without waiting for its WAL flush (synchronous_commit off): a claim that a
-- server crash loses costs nothing (no attempt was counted; the action is due again under the
-- same next epoch, and a message pushed for the lost claim is one more delivery of that epoch,
-- which the take admits once), and anything a worker commits about the claim (its take, a
-- synchronous commit) flushes the WAL up to and past it.
-- The round's statements are planned without sequential scans and never compiled
-- (enable_seqscan and jit off), as an in-process claim's (lane_intake): the claim is prepared
-- once a session, and its generic plan made while the lane table had a page and no rows (an
-- ANALYZE in a quiet moment) scans the whole table in five places, however many lanes wait by
-- the time it runs. Every round opens with this statement, so every plan of its claims is made
-- under it. And a claim is planned once a session, generically (plan_cache_mode): planning a
-- claim took 2.5 to 5 ms, about half its run, and PostgreSQL's own choice planned it anew for
-- its first ten runs on a connection (psycopg's five before it prepares, then five custom
-- plans), every run where a session claims less often than that.
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, true),
       set_config('synchronous_commit', 'off', true),
       set_config('enable_seqscan', 'off', true),
       set_config('jit', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       pg_advisory_xact_lock(2830, hashtext(%(schema)s)) IS NULL AS locked

-- name: claim_round_state
-- A dispatch claim round's first look, once it holds the claim lock: folds the lane intake (as
-- lane_intake, with the paused kinds) and counts each kind's claimed and unfinished actions (as
-- executing_by_kind, as a JSON array, with how many leases ran out: what claim_heads' reclaims
-- would take) in one statement, one round trip. `waiting`: which of `kinds` have a lane head
-- waiting (migration 0013: it runs after the fold and sees its heads), so the round sends no
-- claim statement for a kind with nothing to claim. `next_due_in`: seconds until the soonest
-- scheduled lane head of `kinds` comes due, NULL for none (0031), for the claimer's wait. The counts read a snapshot taken after the
-- lock was granted (never in the statement that waits for it), so they include every claim
-- another claimer committed before. A function (migration 0018), so that the server plans its
-- query once a session: the round sends it in a simple-protocol query, which is planned anew
-- every time.
SELECT * FROM {schema}.agent_action_claim_round_state(%(limit)s, %(kinds)s::text[])

-- name: release_claims
-- Claims whose push failed are given back at once: each (id, epoch) still EXECUTING at that
-- epoch, not taken by a worker and whose write never started becomes ADMITTED and due now
-- (epoch and attempt unchanged; a late delivery of that epoch finds it no longer EXECUTING and
-- is dropped). One whose write started on an earlier epoch keeps its lease (a reclaim reads back).
UPDATE {schema}.agent_action a
   SET state = 'ADMITTED', available_at = now(), lease_until = NULL
  FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(epochs)s::bigint[])) AS m(id, epoch)
 WHERE a.id = m.id  -- a primary-key probe per row, the arrays as in take_attempts
   AND a.epoch = m.epoch AND (a.state = 'EXECUTING') IS TRUE
   AND a.taken_epoch IS DISTINCT FROM a.epoch
   AND a.write_started_at IS NULL
RETURNING a.id, a.epoch

-- name: release_untaken_claims
-- After the broker restarted and lost the messages it held: every claim of these kinds that no
-- worker has taken becomes ADMITTED and due now, as release_claims does (epoch and attempt
-- unchanged; a message of that epoch that survived after all is dropped by the worker's take).
-- Claims pushed since the restart are given back too, which costs each one a message. Reads
-- ix_agent_action_lease (executing actions only).
UPDATE {schema}.agent_action a
   SET state = 'ADMITTED', available_at = now(), lease_until = NULL
 WHERE a.state = 'EXECUTING' AND a.lease_until IS NOT NULL
   AND a.kind = ANY(%(kinds)s::text[])
   AND a.taken_epoch IS DISTINCT FROM a.epoch
   AND a.write_started_at IS NULL
RETURNING a.id, a.epoch

-- name: release_claims_of_lost_claimers
-- The claims a claimer made and no worker took, once that claimer's heartbeat stopped for longer
-- than `silent` (SIGKILLed or OOM-killed between its claim's commit and its push, or its
-- machine gone): each becomes ADMITTED and due now, as release_claims does (epoch and attempt
-- unchanged; a message of that epoch that the claimer did push is dropped by the worker's take).
-- Never this claimer's own (`claimer`), nor those of a claimer that stopped cleanly (it took its
-- heartbeat row away after pushing what it claimed), and none while this claimer's own heartbeat
-- has not run unbroken for `silent` (a database outage silences every claimer at once:
-- outbox_claimer_may_judge, 0034). A lost claimer's row stays until
-- maintenance prunes it, so the probe costs a lookup of the process rows when no claimer was
-- lost, and a read of ix_agent_action_lease (executing actions only) when one was.
WITH lost AS (
    SELECT p.process_id
      FROM {schema}.outbox_process p
     WHERE p.role = 'claimer' AND p.process_id <> %(claimer)s
       AND p.last_seen < now() - %(silent)s
       AND {schema}.outbox_claimer_may_judge(%(claimer)s, %(silent)s, %(gap)s)
)
UPDATE {schema}.agent_action a
   SET state = 'ADMITTED', available_at = now(), lease_until = NULL
  FROM lost
 WHERE a.claimed_by = lost.process_id
   AND a.state = 'EXECUTING' AND a.lease_until IS NOT NULL
   AND a.taken_epoch IS DISTINCT FROM a.epoch
   AND a.write_started_at IS NULL
RETURNING a.id, a.epoch, a.kind, a.claimed_by

-- name: release_attempts_of_lost_workers
-- The attempts a worker took and had not fenced, once that worker's heartbeat stopped for
-- longer than `silent` (SIGKILLed or OOM-killed between its take and its fence, or its machine
-- gone): each becomes ADMITTED and due now, as the end of its lease would have let a claimer
-- reclaim it, only sooner. The attempt stays counted (it was taken), so one whose last attempt
-- it was is left to its lease, where housekeeping ends it FAILED (end_lost_leases). The epoch is
-- unchanged: the worker, should it only have stalled, finds its fence and its finish refused
-- (the action is no longer EXECUTING, then claimed under a new epoch), so nothing runs twice.
-- Never an attempt whose fence passed (its write may have started: the lease decides), nor one
-- of a worker that stopped cleanly (it finished its attempts, then took its heartbeat row away).
-- The attempt's history row ends, RETRY WORKER_LOST, and the action keeps WORKER_LOST as its
-- retry reason (the cause an operator sees should its attempts run out). None while the judging
-- claimer's (`claimer`) own heartbeat has not run unbroken for `silent`: a database outage
-- silences the live workers too (outbox_claimer_may_judge, 0034). The probe reads the process
-- rows, and ix_agent_action_lease (executing actions only) only while a worker lost less than
-- `within` ago (the lease plus the silence: past it, every attempt that worker took has
-- outlived its lease and is a claimer's to reclaim anyway), not for as long as its row stays.
WITH lost AS (
    SELECT p.process_id
      FROM {schema}.outbox_process p
     WHERE p.role = 'worker' AND p.last_seen < now() - %(silent)s
       AND p.last_seen > now() - %(within)s
       AND {schema}.outbox_claimer_may_judge(%(claimer)s, %(silent)s, %(gap)s)
), released AS (
    UPDATE {schema}.agent_action a
       SET state = 'ADMITTED', available_at = now(), lease_until = NULL,
           retry_reason = 'WORKER_LOST'
      FROM lost
     WHERE a.taken_by = lost.process_id
       AND a.state = 'EXECUTING' AND a.lease_until IS NOT NULL
       AND a.taken_epoch = a.epoch
       AND a.write_started_at IS NULL
       AND a.attempt < a.max_attempts
    RETURNING a.id, a.epoch, a.kind, a.taken_by
), history AS (
    UPDATE {schema}.agent_action_attempt h
       SET ended_at = now(), result = 'RETRY', reason = 'WORKER_LOST'
      FROM released r
     WHERE h.action_id = r.id AND h.epoch = r.epoch AND h.ended_at IS NULL
)
SELECT id, epoch, kind, taken_by FROM released

-- name: listen_enqueues
-- Wakes this connection on every enqueueing statement (trigger agent_action_inserted, 0004)
-- and on every lane whose next action became due. {channel} is filled in as an identifier:
-- outbox_<schema>.
LISTEN {channel}

-- name: begin_write
-- The fence: the write starts only while this claim's epoch holds and at least the write margin
-- of its lease is left. When the adapter gives the provider's reference of its write before the
-- call (an email's Message-ID), the attempt's history row records it with the fence (an
-- in-process attempt, whose claim was its take, starts its row here: `claimed_at` is the
-- claim's lease start, now when the caller does not know it); otherwise the finish records the
-- fence's time, and no history row is written here.
WITH fenced AS (
    UPDATE {schema}.agent_action a SET write_started_at = now()
     WHERE a.id = %(id)s AND a.epoch = %(epoch)s AND (a.state = 'EXECUTING') IS TRUE
       AND a.lease_until - now() >= %(margin)s
    RETURNING a.id, a.epoch, a.attempt
), history AS (
    INSERT INTO {schema}.agent_action_attempt AS h
        (action_id, epoch, attempt, claimed_at, taken_at, fence_passed_at, provider_ref)
    SELECT f.id, f.epoch, f.attempt, coalesce(%(claimed_at)s::timestamptz, now()),
           coalesce(%(claimed_at)s::timestamptz, now()), now(), %(ref)s::text
      FROM fenced f
     WHERE %(ref)s::text IS NOT NULL
    ON CONFLICT (action_id, epoch) DO UPDATE
       SET fence_passed_at = excluded.fence_passed_at,
           provider_ref = coalesce(excluded.provider_ref, h.provider_ref)
)
SELECT id FROM fenced

-- name: take_attempts
-- take_attempt for many messages in one statement (outbox/batching.py): each row keeps its own
-- epoch and once-per-epoch check. The batched statements reach each row by `a.id = m.id`
-- alone, so the plan probes the primary key once per batch row: an `a.id = ANY(ids)` scan
-- beside it let the generic plan join the batch in a nested loop with a join filter, n x n
-- comparisons (65,280 at 256 rows; tests/test_core_batch_plans.py counts the rows each batched
-- statement's generic plan visits). They test the state as `(a.state = 'EXECUTING') IS TRUE`
-- (the same test, state being NOT NULL), which keeps the planner off the executing rows' partial
-- indexes: statistics taken while little was executing make a scan of one look cheaper than a
-- probe, and such a scan a batch row, or a nested loop over it, compares every pair.
-- Each array reaches unnest as a scalar sub-select, `(SELECT %(ids)s::bigint[])`: the planner
-- then guesses the batch at ten rows, as it does a generic plan's parameter, also in the plans
-- made for a statement's values (its first runs on each connection). Knowing the true size (a
-- few hundred), it found one scan of a table of some thousands of rows cheaper than as many
-- probes, and joined the batch to that scan's executing rows with a join filter: 20,000
-- comparisons for a finish of 100 among 200 executing actions.
-- History rows as in take_attempt, and as there one probe a row: `target` is planned on its own
-- (MATERIALIZED, each row by a probe of its own), and the update follows its tuple ids. It
-- commits without waiting for its WAL flush and names its worker, as take_attempt does.
WITH target AS MATERIALIZED (
    SELECT a.tid, a.epoch, a.claim_lease_until
      FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(epochs)s::bigint[])) AS m(id, epoch)
     CROSS JOIN LATERAL (
           SELECT a.ctid AS tid, a.epoch, a.lease_until AS claim_lease_until
             FROM {schema}.agent_action a
            WHERE a.id = m.id AND a.epoch = m.epoch AND (a.state = 'EXECUTING') IS TRUE
              AND a.taken_epoch IS DISTINCT FROM a.epoch
            LIMIT 1) a
), taken AS (
    UPDATE {schema}.agent_action a
       SET taken_epoch = a.epoch, attempt = a.attempt + 1, lease_until = now() + %(lease)s,
           taken_by = nullif(%(taker)s::text, '')
      FROM target
     WHERE a.ctid = target.tid AND a.epoch = target.epoch AND (a.state = 'EXECUTING') IS TRUE
       AND a.taken_epoch IS DISTINCT FROM a.epoch
    RETURNING a.*, a.lease_until - now() AS lease_left, target.claim_lease_until
), history AS (
    INSERT INTO {schema}.agent_action_attempt (action_id, epoch, attempt, claimed_at, taken_at)
    SELECT t.id, t.epoch, t.attempt, t.claim_lease_until - %(lease)s::interval, now()
      FROM taken t
    ON CONFLICT (action_id, epoch) DO NOTHING
), lost AS (
    UPDATE {schema}.agent_action_attempt h
       SET fence_passed_at = t.write_started_at
      FROM taken t
     WHERE t.write_started_at IS NOT NULL
       AND h.action_id = t.id AND h.epoch < t.epoch
       AND h.ended_at IS NULL AND h.fence_passed_at IS NULL
)
SELECT * FROM taken WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL

-- name: begin_writes
-- begin_write for many attempts in one statement: each row keeps its own epoch and margin check
-- (and a history row only where a provider reference is given). A probe a row, the batch's
-- arrays as in take_attempts.
WITH fenced AS (
    UPDATE {schema}.agent_action a SET write_started_at = now()
      FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(epochs)s::bigint[]),
                  (SELECT %(margins)s::interval[]), (SELECT %(refs)s::text[]),
                  (SELECT %(claimed_ats)s::timestamptz[]))
           AS m(id, epoch, margin, ref, claimed_at)
     WHERE a.id = m.id AND a.epoch = m.epoch AND (a.state = 'EXECUTING') IS TRUE
       AND a.lease_until - now() >= m.margin
    RETURNING a.id, a.epoch, a.attempt, m.ref, m.claimed_at
), history AS (
    INSERT INTO {schema}.agent_action_attempt AS h
        (action_id, epoch, attempt, claimed_at, taken_at, fence_passed_at, provider_ref)
    SELECT f.id, f.epoch, f.attempt, coalesce(f.claimed_at, now()),
           coalesce(f.claimed_at, now()), now(), f.ref
      FROM fenced f
     WHERE f.ref IS NOT NULL
    ON CONFLICT (action_id, epoch) DO UPDATE
       SET fence_passed_at = excluded.fence_passed_at,
           provider_ref = coalesce(excluded.provider_ref, h.provider_ref)
)
SELECT id, epoch FROM fenced

-- name: finish_many
-- Every attempt's finish, for one attempt or many in one statement (outbox/batching.py), each
-- row only if its epoch still holds (outbox.results.Finish says what a row means). An end
-- (DONE, UNCERTAIN, FAILED, CANCELLED) sets its stop reason and readback_ref, keeps the last
-- retry's reason unless given one (the cause of ATTEMPTS_EXHAUSTED), drops the payload and sets
-- ended_at. A wait (ADMITTED: a retry, a deferral) is due again `after` from now with its
-- retry_reason, its lease and fence cleared (the write's start kept as earlier_write_at, for a
-- read-back adapter), and a deferral gives its attempt back. Rows as in take_attempts.
-- The attempt's history row ends with it (its result, reason, provider reference, error class,
-- and when its fence passed, if it did: `fenced`; an in-process attempt's row starts here unless
-- its fence started it), and an end
-- other than DONE parks the payload for an operator's resend or retry (read in the statement's
-- snapshot, before the update dropped it; only those rows are probed).
-- The lane hand-off: an end whose `hand_offs` lease is not NULL also claims and takes its lane's
-- next action, when that one is due, not expired, of the same kind and limit key, of a kind not
-- paused nor held by its provider's outage (nor probing it after a hold), and the lane is not
-- held by an erased write (`busy_until`). The end and the claim are
-- one statement, so no count a claimer bounds (in flight a kind, a key's executing actions)
-- ever rises: one executing action of the kind and key replaces another. The next action's
-- lease is the given one; its attempt's history row starts here, and it names its worker
-- (`taker`), as a take's does; its row is returned beside its predecessor's (`next_*`), with
-- the payload. A wait (a retry, a deferral)
-- hands nothing on: the action waits at its lane's head again.
-- A provider outage (outbox/provider_outage.py): `outage_kind` names the kind of a row that
-- ended `Retry` (`retried`: a wait, an end ATTEMPTS_EXHAUSTED, or an attempt given back during
-- an outage), or of any row whose kind's outage row holds retries (read once, a table of few
-- rows); NULL otherwise, so that the caller writes the outage rows (provider_outage_note) only
-- when a row says so. The write is a statement of its own: even writing nothing, an INSERT
-- here cost every finish of 100 about 0.3 ms.
WITH finished AS (
UPDATE {schema}.agent_action a
   SET state = m.state,
       stop_reason = CASE WHEN m.waits THEN a.stop_reason ELSE m.stop_reason END,
       readback_ref = CASE WHEN m.waits THEN a.readback_ref ELSE m.ref END,
       retry_reason = CASE WHEN m.waits THEN m.retry_reason
                           ELSE coalesce(m.retry_reason, a.retry_reason) END,
       available_at = CASE WHEN m.waits THEN now() + m.after ELSE a.available_at END,
       attempt = a.attempt - m.gives_back::int,
       earlier_write_at = CASE WHEN m.waits THEN coalesce(a.write_started_at, a.earlier_write_at)
                               ELSE a.earlier_write_at END,
       write_started_at = CASE WHEN m.waits THEN NULL ELSE a.write_started_at END,
       lease_until = CASE WHEN m.waits THEN NULL ELSE a.lease_until END,
       payload = CASE WHEN m.waits THEN a.payload END,
       ended_at = CASE WHEN m.waits THEN a.ended_at ELSE now() END
  FROM (SELECT u.*, u.state = 'ADMITTED' AS waits
          FROM unnest((SELECT %(ids)s::bigint[]), (SELECT %(epochs)s::bigint[]),
                      (SELECT %(states)s::text[]), (SELECT %(stop_reasons)s::text[]),
                      (SELECT %(refs)s::text[]), (SELECT %(retry_reasons)s::text[]),
                      (SELECT %(afters)s::interval[]), (SELECT %(gives_back)s::boolean[]),
                      (SELECT %(error_classes)s::text[]),
                      (SELECT %(claimed_ats)s::timestamptz[]),
                      (SELECT %(fenced)s::boolean[]), (SELECT %(hand_offs)s::interval[]),
                      (SELECT %(retried)s::boolean[]))
               AS u(id, epoch, state, stop_reason, ref, retry_reason, after, gives_back,
                    error_class, claimed_at, fenced, hand_off, retried)) m
 WHERE a.id = m.id AND a.epoch = m.epoch AND (a.state = 'EXECUTING') IS TRUE  -- a probe a row
-- This attempt's fence time: an end keeps write_started_at, a wait moved it to
-- earlier_write_at (both only meaningful when this attempt passed its fence).
RETURNING a.id, a.epoch, a.attempt + m.gives_back::int AS attempt, m.state, m.waits,
          m.gives_back, m.stop_reason, m.retry_reason, m.ref, m.error_class, m.claimed_at,
          CASE WHEN m.fenced THEN coalesce(a.write_started_at, a.earlier_write_at) END
              AS fenced_at,
          a.lane_key, a.kind, coalesce(a.limit_key, a.workspace_id, '') AS key,
          CASE WHEN NOT m.waits THEN m.hand_off END AS hand_off, m.retried
), history AS (
    INSERT INTO {schema}.agent_action_attempt AS h
        (action_id, epoch, attempt, claimed_at, taken_at, fence_passed_at, ended_at, result,
         reason, provider_ref, error_class)
    SELECT f.id, f.epoch, f.attempt, coalesce(f.claimed_at, now()),
           coalesce(f.claimed_at, now()), f.fenced_at, now(),
           CASE WHEN f.waits AND f.retried THEN 'RETRY' WHEN f.gives_back THEN 'DEFER'
                WHEN f.waits THEN 'RETRY' ELSE f.state END,
           coalesce(f.retry_reason, f.stop_reason), f.ref, f.error_class
      FROM finished f
    ON CONFLICT (action_id, epoch) DO UPDATE
       SET fence_passed_at = coalesce(h.fence_passed_at, excluded.fence_passed_at),
           ended_at = excluded.ended_at, result = excluded.result, reason = excluded.reason,
           provider_ref = coalesce(excluded.provider_ref, h.provider_ref),
           error_class = excluded.error_class
), parked AS (
    INSERT INTO {schema}.agent_action_parked_payload (action_id, payload)
    SELECT o.id, o.payload
      FROM finished f JOIN {schema}.agent_action o ON o.id = f.id
     WHERE f.state IN ('UNCERTAIN', 'FAILED', 'CANCELLED') AND o.payload IS NOT NULL
    ON CONFLICT (action_id) DO NOTHING
), successor AS (
    -- The lane's first waiting action: one probe of ix_agent_action_lane_waiting an end that
    -- hands off, none for any other row. The statement's snapshot shows the ended action as it
    -- was (executing), not waiting, so it is never its own successor.
    SELECT f.id AS after_id, f.hand_off, b.id
      FROM finished f
     CROSS JOIN LATERAL (
           SELECT b.id, b.kind, b.state, b.available_at, b.expires_at,
                  coalesce(b.limit_key, b.workspace_id, '') AS key
             FROM {schema}.agent_action b
            WHERE f.hand_off IS NOT NULL
              AND b.lane_key = f.lane_key AND b.state IN ('PROPOSED', 'ADMITTED')
            ORDER BY b.id
            LIMIT 1) b
     WHERE b.state = 'ADMITTED' AND b.available_at <= now()
       AND (b.expires_at IS NULL OR b.expires_at > now())
       AND b.kind = f.kind AND b.key = f.key
       AND NOT EXISTS (SELECT 1 FROM {schema}.agent_action_kind_pause p WHERE p.kind = b.kind)
       AND NOT EXISTS (SELECT 1 FROM {schema}.agent_action_kind_outage o
                        WHERE o.kind = b.kind AND o.holds > 0)
       AND NOT EXISTS (SELECT 1 FROM {schema}.agent_action_lane l
                        WHERE l.lane_key = f.lane_key AND l.busy_until > now())
), ready AS (
    SELECT s.after_id, s.hand_off, a.id
      FROM successor s
      JOIN {schema}.agent_action a ON a.id = s.id
     WHERE a.state = 'ADMITTED'
       FOR UPDATE OF a SKIP LOCKED  -- an operator's or an erasure's statement holds it: left
), handed AS (
    UPDATE {schema}.agent_action a
       SET state = 'EXECUTING', epoch = a.epoch + 1, lease_until = now() + r.hand_off,
           attempt = a.attempt + 1, taken_epoch = a.epoch + 1,
           taken_by = nullif(%(taker)s::text, '')
      FROM ready r
     WHERE a.id = r.id
    RETURNING r.after_id, a.id, a.kind, a.state, a.workspace_id, a.lane_key, a.idempotency_key,
              a.payload, a.subject_account_id, a.max_attempts, a.expires_at, a.attempt, a.epoch,
              a.available_at, a.lease_until, a.write_started_at, a.earlier_write_at,
              a.readback_ref, a.stop_reason, a.retry_reason, a.created_at, a.ended_at,
              a.priority, a.limit_key, a.lease_until - now() AS lease_left
), handed_history AS (
    INSERT INTO {schema}.agent_action_attempt (action_id, epoch, attempt, claimed_at, taken_at)
    SELECT h.id, h.epoch, h.attempt, now(), now()
      FROM handed h
    ON CONFLICT (action_id, epoch) DO NOTHING
)
SELECT f.id, f.epoch,
       CASE WHEN f.retried
                 OR f.kind IN (SELECT r.kind FROM {schema}.agent_action_kind_outage r
                                WHERE r.since IS NOT NULL)
            THEN f.kind END AS outage_kind,
       h.id AS next_id, h.kind AS next_kind, h.state AS next_state,
       h.workspace_id AS next_workspace_id, h.lane_key AS next_lane_key,
       h.idempotency_key AS next_idempotency_key, h.payload AS next_payload,
       h.subject_account_id AS next_subject_account_id, h.max_attempts AS next_max_attempts,
       h.expires_at AS next_expires_at, h.attempt AS next_attempt, h.epoch AS next_epoch,
       h.available_at AS next_available_at, h.lease_until AS next_lease_until,
       h.write_started_at AS next_write_started_at, h.earlier_write_at AS next_earlier_write_at,
       h.readback_ref AS next_readback_ref, h.stop_reason AS next_stop_reason,
       h.retry_reason AS next_retry_reason, h.created_at AS next_created_at,
       h.ended_at AS next_ended_at, h.priority AS next_priority, h.limit_key AS next_limit_key,
       h.lease_left AS next_lease_left
  FROM finished f
  LEFT JOIN handed h ON h.after_id = f.id

-- name: provider_outage_note
-- What a finish statement's rows said of provider outages (outbox/provider_outage.py): each
-- kind in `resets` (a DONE of it ended while its row held retries) is emptied; each action of
-- `ids` (an attempt of it ended `Retry`, of the kind beside it in `kinds`) joins its kind's row,
-- at most 16 distinct ids, the first one's time kept as `since`. Kinds in kind order, so that
-- two statements lock their rows in the same order. An emptied row's hold ends with it (0033).
-- Returns each retried kind's row as it is now, for the caller to decide whether to hold it
-- (provider_outage_hold).
INSERT INTO {schema}.agent_action_kind_outage AS o (kind, since, retried)
SELECT x.kind, CASE WHEN NOT x.reset THEN now() END,
       CASE WHEN x.reset THEN '{}' ELSE x.ids[1:16] END
  FROM (SELECT k.kind, true AS reset, NULL::bigint[] AS ids
          FROM unnest(%(resets)s::text[]) AS k(kind)
        UNION ALL
        SELECT r.kind, false, array_agg(r.id ORDER BY r.id)
          FROM unnest(%(kinds)s::text[], %(ids)s::bigint[]) AS r(kind, id)
         GROUP BY r.kind) x
 ORDER BY x.kind
ON CONFLICT (kind) DO UPDATE
   SET since = CASE WHEN excluded.since IS NULL THEN NULL
                    ELSE coalesce(o.since, excluded.since) END,
       retried = CASE WHEN excluded.since IS NULL THEN '{}'
                      WHEN cardinality(o.retried) >= 16 THEN o.retried
                      ELSE (SELECT array_agg(x.id ORDER BY x.first)
                              FROM (SELECT r.id, min(r.n) AS first
                                      FROM unnest(o.retried || excluded.retried)
                                           WITH ORDINALITY AS r(id, n)
                                     GROUP BY r.id
                                     ORDER BY min(r.n)
                                     LIMIT 16) x) END,
       held_until = CASE WHEN excluded.since IS NULL THEN NULL ELSE o.held_until END,
       holds = CASE WHEN excluded.since IS NULL THEN 0 ELSE o.holds END
RETURNING o.kind, cardinality(o.retried) AS actions,
          extract(epoch FROM now() - o.since)::float8 AS retrying_for,
          o.held_until > now() AS held, o.holds

-- name: provider_outage_hold
-- Holds each kind of `kinds` (whose provider counts as down: outbox.provider_outage) for its
-- next hold, `fors` long, unless another process held it meanwhile: claims skip a held kind
-- until `held_until`, then probe it one action at a time (claim_heads). A NULL in `fors`
-- releases the kind instead (its outage went past its limit): claims take it as before.
UPDATE {schema}.agent_action_kind_outage o
   SET held_until = now() + h.hold_for,
       holds = CASE WHEN h.hold_for IS NULL THEN 0 ELSE o.holds + 1 END
  FROM unnest(%(kinds)s::text[], %(fors)s::interval[]) AS h(kind, hold_for)
 WHERE o.kind = h.kind AND o.since IS NOT NULL
   AND (o.held_until IS NULL OR o.held_until <= now())

-- name: provider_outages
-- The kinds whose attempts retry now (status, metrics, the console), or only `kind`'s (an
-- attempt that would otherwise end ATTEMPTS_EXHAUSTED asks; NULL for every kind): the distinct
-- actions since the kind's last DONE (up to 16), and how long ago the first of them retried
-- (seconds). The table holds at most a row a kind, so a generic plan's scan of it to answer one
-- kind costs about what a probe does. Whether that counts as down is decided in one place,
-- outbox.provider_outage.OutageRule.verdict.
-- `held_for`: seconds until the kind's hold ends (0 when it is not held); `holds`: its holds in
-- this outage (after a hold, its claims probe the provider one action at a time).
SELECT o.kind, cardinality(o.retried) AS actions,
       extract(epoch FROM now() - o.since)::float8 AS retrying_for,
       greatest(extract(epoch FROM o.held_until - now()), 0)::float8 AS held_for, o.holds
  FROM {schema}.agent_action_kind_outage o
 WHERE o.since IS NOT NULL AND (%(kind)s::text IS NULL OR o.kind = %(kind)s)
 ORDER BY o.kind

-- name: make_due
-- Tests only (outbox.testing.drain): every admitted action that waits becomes due now (read
-- through ix_agent_action_deferred, as waits_by_kind), and every provider outage's hold of a
-- kind ends now, its probing too (its actions are claimed again; another retry holds it again).
WITH holds AS (
    UPDATE {schema}.agent_action_kind_outage SET held_until = NULL, holds = 0 WHERE holds > 0
)
UPDATE {schema}.agent_action SET available_at = now()
 WHERE state = 'ADMITTED' AND available_at > now() AND available_at > created_at

-- name: executing_by_kind
-- Claimed and not yet finished, per kind: `n` with a lease that still runs (the in-flight
-- count), and `unconsumed` whose lease ran out before any worker took their message (the
-- claimer stops claiming that kind until a worker takes one again).
SELECT kind,
       count(*) FILTER (WHERE lease_until > now()) AS n,
       count(*) FILTER (WHERE lease_until <= now() AND taken_epoch IS DISTINCT FROM epoch)
           AS unconsumed
  FROM {schema}.agent_action
 WHERE state = 'EXECUTING'
 GROUP BY kind

-- name: rate_buckets_ensure
-- Rate limits: the buckets an action draws from exist (one row a kind, or a kind and a key).
INSERT INTO {schema}.agent_action_rate (bucket)
SELECT b FROM unnest(%(buckets)s::text[]) AS u(b) ORDER BY b
ON CONFLICT (bucket) DO NOTHING

-- name: rate_reserve
-- Rate limits: the next slot free in every bucket an action draws from (`buckets`, each with
-- its `spacings`, the limit's interval over its count), not before a provider's hold: when it
-- is at most `max_wait` away, every bucket's next slot moves to it plus its spacing (reserved).
-- `found` < the buckets given means a bucket row is missing (rate_buckets_ensure, then again).
-- The bucket rows are locked in name order, so two reservations never wait on each other.
WITH b AS (
    SELECT r.bucket, r.next_at, r.held_until, m.spacing
      FROM {schema}.agent_action_rate r
      JOIN unnest(%(buckets)s::text[], %(spacings)s::interval[]) AS m(bucket, spacing)
        ON m.bucket = r.bucket
     ORDER BY r.bucket
       FOR UPDATE OF r
), slot AS (
    -- The clock after the locks were granted, not the statement's start: a reservation that
    -- queued behind others must not take a slot in the past, nor sleep from a stale time.
    SELECT greatest(clock_timestamp(), max(b.next_at), max(b.held_until)) AS at,
           count(*) AS found
      FROM b
), taken AS (
    UPDATE {schema}.agent_action_rate r
       SET next_at = slot.at + b.spacing, used_at = now()
      FROM b, slot
     WHERE r.bucket = b.bucket
       AND slot.found = cardinality(%(buckets)s::text[])
       AND slot.at <= clock_timestamp() + %(max_wait)s
    RETURNING r.bucket
)
SELECT extract(epoch FROM slot.at - clock_timestamp())::float8 AS wait, slot.found,
       (SELECT count(*) FROM taken) > 0 AS reserved,
       extract(epoch FROM slot.at)::float8 AS at_epoch,
       extract(epoch FROM clock_timestamp())::float8 AS db_now
  FROM slot

-- name: rate_hold
-- Rate limits: a provider asked for a pause (429 / Retry-After, an adapter's Defer): no slot of
-- these buckets is handed out before `after` from now, to any worker.
UPDATE {schema}.agent_action_rate
   SET held_until = greatest(held_until, now() + %(after)s)
 WHERE bucket = ANY(%(buckets)s::text[])

-- name: rate_buckets
-- Rate limits (status, metrics, the console): every bucket with its next free slot and the
-- provider's hold, as seconds from now (0 when free), most recently used first.
SELECT bucket,
       greatest(extract(epoch FROM next_at - now()), 0)::float8 AS next_in,
       greatest(coalesce(extract(epoch FROM held_until - now()), 0), 0)::float8 AS held_for,
       used_at
  FROM {schema}.agent_action_rate
 ORDER BY used_at DESC
 LIMIT %(limit)s

-- name: rate_prune
-- Retention: buckets no reservation used for `idle` (a key's bucket: keys come and go).
DELETE FROM {schema}.agent_action_rate
 WHERE used_at < now() - %(idle)s AND (held_until IS NULL OR held_until < now())

-- name: probe_state
-- The claimer's probe `(id, epoch)`: `waiting` while it is still a claim no worker took (false
-- once taken, ended, erased or claimed again), `expired` once its lease ran out.
SELECT coalesce(bool_or(state = 'EXECUTING' AND taken_epoch IS DISTINCT FROM epoch), false)
           AS waiting,
       coalesce(bool_or(lease_until <= now()), false) AS expired
  FROM {schema}.agent_action
 WHERE id = %(id)s AND epoch = %(epoch)s

-- name: erase_subject
-- Erasure: every action whose subject is the account is deleted, and with it its attempts, its
-- resolution, its links and its parked payload (in this statement: the operator's tables hold
-- no foreign key, whose per-row triggers would make every prune several times dearer).
WITH gone AS (
    DELETE FROM {schema}.agent_action WHERE subject_account_id = %(account_id)s
    RETURNING id, state
), attempts AS (
    DELETE FROM {schema}.agent_action_attempt h USING gone WHERE h.action_id = gone.id
), resolutions AS (
    DELETE FROM {schema}.agent_action_resolution r USING gone WHERE r.action_id = gone.id
), links AS (
    DELETE FROM {schema}.agent_action_link k USING gone
     WHERE k.from_id = gone.id OR k.to_id = gone.id
), parked AS (
    DELETE FROM {schema}.agent_action_parked_payload p USING gone WHERE p.action_id = gone.id
)
SELECT id, state FROM gone

-- name: prune_preview
-- What `prune_ended` would delete now, by kind and state (`outbox prune --dry-run`, and the
-- counts it shows before it asks).
SELECT kind, state, count(*) AS n FROM {schema}.agent_action
 WHERE ended_at IS NOT NULL AND ended_at < now() - %(retention)s
 GROUP BY kind, state ORDER BY kind, state

-- name: erase_preview
-- What `erase_subject` would delete now, by kind and state (`outbox erase --dry-run`).
SELECT kind, state, count(*) AS n FROM {schema}.agent_action
 WHERE subject_account_id = %(account_id)s
 GROUP BY kind, state ORDER BY kind, state

-- name: prune_ended
-- Retention: a small batch of actions that ended more than the retention ago, with their
-- attempts, resolutions, links and parked payloads (as erase_subject). SKIP LOCKED so a prune
-- never waits on, nor holds up, anything else.
WITH old AS (
    SELECT id FROM {schema}.agent_action
     WHERE ended_at IS NOT NULL AND ended_at < now() - %(retention)s
     ORDER BY ended_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM {schema}.agent_action a USING old WHERE a.id = old.id
    RETURNING a.id
), attempts AS (
    DELETE FROM {schema}.agent_action_attempt h USING gone WHERE h.action_id = gone.id
), resolutions AS (
    DELETE FROM {schema}.agent_action_resolution r USING gone WHERE r.action_id = gone.id
), links AS (
    DELETE FROM {schema}.agent_action_link k USING gone
     WHERE k.from_id = gone.id OR k.to_id = gone.id
), parked AS (
    DELETE FROM {schema}.agent_action_parked_payload p USING gone WHERE p.action_id = gone.id
)
SELECT id FROM gone

-- name: declared_kinds
-- The kinds the database knows.
SELECT name, at_most_once, instance_level FROM {schema}.agent_action_kind ORDER BY name

-- name: live_actions_of_kind
-- How many actions of a kind have not ended (a flag change is refused while there are any).
SELECT count(*) AS n FROM {schema}.agent_action
 WHERE kind = %(kind)s AND state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')

-- name: declare_kind
-- Insert or update a kind's flags.
INSERT INTO {schema}.agent_action_kind (name, at_most_once, instance_level)
VALUES (%(name)s, %(at_most_once)s, %(instance_level)s)
ON CONFLICT (name) DO UPDATE
   SET at_most_once = excluded.at_most_once, instance_level = excluded.instance_level,
       declared_at = now()
 WHERE (agent_action_kind.at_most_once, agent_action_kind.instance_level)
       IS DISTINCT FROM (excluded.at_most_once, excluded.instance_level)

-- name: backlog_by_kind
-- Per declared kind: admitted actions that are due (and not expired), and the age in seconds of
-- the oldest one by the database clock (0 when none). Reads the waiting actions through
-- ix_agent_action_lane_waiting (no index holds the due ones alone: an action due at its enqueue
-- enters none, migration 0025), aggregated before the kinds are joined.
SELECT k.name AS kind,
       coalesce(d.due, 0) AS due,
       coalesce(d.oldest_due_age, 0)::float8 AS oldest_due_age
  FROM {schema}.agent_action_kind k
  LEFT JOIN (SELECT a.kind, count(*) AS due,
                    extract(epoch FROM now() - min(a.available_at)) AS oldest_due_age
               FROM {schema}.agent_action a
              WHERE a.state = 'ADMITTED' AND a.available_at <= now()
                AND (a.expires_at IS NULL OR a.expires_at > now())
              GROUP BY a.kind) d ON d.kind = k.name
 ORDER BY k.name

-- name: blocked_lanes_by_kind
-- Lanes whose head is waiting for a retry (it was attempted and came back ADMITTED) while later
-- actions wait behind it, per kind of the head. Starts from the attempted waiting actions, read
-- through ix_agent_action_deferred (a retry is due again later than its action's creation: the
-- created_at test says so, for the planner to match the index's predicate), then one probe of
-- the lane row and one of ix_agent_action_lane_waiting each. Reading every idle lane row and
-- probing its head's row instead cost the backlog gauges a probe a lane at every refresh: with
-- 200,000 fresh one-action lanes draining, four probes of agent_action an action more, and a
-- tenth of the drain's rate. The attempted actions are gathered first (MATERIALIZED) so that
-- the planner charges the probes to the few it expects, not to every deferred row, which put a
-- big backlog's plan past jit_above_cost.
WITH attempted AS MATERIALIZED (
    SELECT a.id, a.kind, a.lane_key
      FROM {schema}.agent_action a
     WHERE a.state = 'ADMITTED' AND a.available_at > a.created_at AND a.attempt > 0
)
SELECT h.kind, count(*) AS lanes
  FROM attempted h
 WHERE EXISTS (SELECT 1 FROM {schema}.agent_action_lane l
                WHERE l.lane_key = h.lane_key AND l.head_id = h.id AND l.executing_id IS NULL)
   AND EXISTS (SELECT 1 FROM {schema}.agent_action b
                WHERE b.lane_key = h.lane_key AND b.state IN ('PROPOSED', 'ADMITTED')
                  AND b.id > h.id)
 GROUP BY h.kind

-- name: waits_by_kind
-- Limits view (status, metrics, the console): per kind, admitted actions not yet due (scheduled
-- by not_before, backing off after a retry, or deferred), how many of those wait for a rate
-- limit's slot, and when the next one is due. Reads ix_agent_action_deferred: what is due later
-- was deferred past its creation (the created_at test says so, for the planner to match the
-- index's predicate).
SELECT kind,
       count(*) AS waiting,
       count(*) FILTER (WHERE retry_reason = 'RATE_LIMITED') AS rate_limited,
       min(available_at) AS next_due_at
  FROM {schema}.agent_action
 WHERE state = 'ADMITTED' AND available_at > now() AND available_at > created_at
 GROUP BY kind

-- name: executing_by_limit_key
-- Limits view: the limit keys with the most executing actions, per kind (what the per-key
-- concurrency caps count). Reads executing rows only.
SELECT kind, coalesce(limit_key, workspace_id, '') AS limit_key, count(*) AS executing
  FROM {schema}.agent_action
 WHERE state = 'EXECUTING'
 GROUP BY 1, 2
 ORDER BY 3 DESC, 1, 2
 LIMIT %(limit)s

-- name: counts_by_kind_and_state
-- Status: how many actions each kind has in each state (a full count; an operator's command).
SELECT kind, state, count(*) AS n FROM {schema}.agent_action GROUP BY kind, state ORDER BY kind, state

-- name: latest_ended_in_state
-- Status: the most recently ended actions in one state, newest first, without their payload,
-- each with the provider reference its latest attempt recorded (an UNCERTAIN email's
-- Message-ID) and a person's resolution, if any.
SELECT a.id, a.kind, a.state, a.stop_reason, a.retry_reason, a.workspace_id, a.lane_key,
       a.attempt, a.max_attempts, a.created_at, a.ended_at,
       coalesce(a.readback_ref,
                (SELECT h.provider_ref FROM {schema}.agent_action_attempt h
                  WHERE h.action_id = a.id AND h.provider_ref IS NOT NULL
                  ORDER BY h.epoch DESC LIMIT 1)) AS provider_ref,
       r.outcome AS resolution, r.resolved_by
  FROM {schema}.agent_action a
  LEFT JOIN {schema}.agent_action_resolution r ON r.action_id = a.id
 WHERE a.ended_at IS NOT NULL AND a.state = %(state)s
 ORDER BY a.ended_at DESC, a.id DESC
 LIMIT %(limit)s

-- name: lane_of_action
-- Inspect: the head of an action's lane from its lane row (if an action of the lane waits), the
-- lane's executing action, and how many waiting actions of that lane come before it.
SELECT l.head_id, l.head_kind, l.head_due_at,
       (SELECT x.id FROM {schema}.agent_action x
         WHERE x.lane_key = %(lane_key)s AND x.state = 'EXECUTING') AS executing_id,
       (SELECT count(*) FROM {schema}.agent_action b
         WHERE b.lane_key = %(lane_key)s AND b.state IN ('PROPOSED', 'ADMITTED')
           AND b.id < %(id)s) AS waiting_before,
       now() AS db_now
  FROM (SELECT 1) one
  LEFT JOIN {schema}.agent_action_lane l ON l.lane_key = %(lane_key)s

-- name: webhook_subscription_insert
-- Webhooks: add a subscription (enabled, no failures yet).
INSERT INTO {schema}.webhook_subscription (endpoint_url, secrets, event_types)
VALUES (%(endpoint_url)s, %(secrets)s, %(event_types)s)
RETURNING *

-- name: webhook_subscriptions_all
-- Webhooks: every subscription, oldest first.
SELECT * FROM {schema}.webhook_subscription ORDER BY id

-- name: webhook_subscription_by_id
-- Webhooks: one subscription, as the adapter reads it before every attempt.
SELECT * FROM {schema}.webhook_subscription WHERE id = %(id)s

-- name: webhook_subscriptions_matching
-- Webhooks: the enabled subscriptions to an event type ('*' matches every type), in id order;
-- read in the caller's transaction by enqueue_webhook.
SELECT id FROM {schema}.webhook_subscription
 WHERE enabled AND (%(event_type)s = ANY(event_types) OR '*' = ANY(event_types))
 ORDER BY id

-- name: webhook_subscription_disable
-- Webhooks: an operator (or a 410 from the endpoint) disables a subscription; its actions wait.
UPDATE {schema}.webhook_subscription
   SET enabled = false, disabled_at = coalesce(disabled_at, now()), disabled_reason = %(reason)s
 WHERE id = %(id)s
RETURNING *

-- name: webhook_subscription_enable
-- Webhooks: an operator enables a subscription again, its failure count starting afresh.
UPDATE {schema}.webhook_subscription
   SET enabled = true, disabled_at = NULL, disabled_reason = NULL, consecutive_failures = 0
 WHERE id = %(id)s
RETURNING *

-- name: webhook_subscription_set_secrets
-- Webhooks: replace a subscription's signing secrets (newest first).
UPDATE {schema}.webhook_subscription SET secrets = %(secrets)s WHERE id = %(id)s
RETURNING *

-- name: webhook_subscription_delete
-- Webhooks: remove a subscription; its waiting actions end CANCELLED at their next attempt.
DELETE FROM {schema}.webhook_subscription WHERE id = %(id)s RETURNING id

-- name: webhook_delivery_accepted
-- Webhooks: the endpoint accepted a delivery, so its run of failures is over.
UPDATE {schema}.webhook_subscription SET consecutive_failures = 0
 WHERE id = %(id)s AND consecutive_failures <> 0

-- name: webhook_delivery_failed
-- Webhooks: the endpoint did not accept a delivery; at the limit of consecutive failures the
-- subscription is disabled (only while enabled, so an operator's reason is never overwritten).
UPDATE {schema}.webhook_subscription
   SET consecutive_failures = consecutive_failures + 1,
       enabled = enabled AND consecutive_failures + 1 < %(limit)s,
       disabled_at = CASE WHEN enabled AND consecutive_failures + 1 >= %(limit)s THEN now()
                          ELSE disabled_at END,
       disabled_reason = CASE WHEN enabled AND consecutive_failures + 1 >= %(limit)s
                              THEN %(reason)s ELSE disabled_reason END
 WHERE id = %(id)s
RETURNING enabled, consecutive_failures

-- name: webhook_subscriptions_disabled
-- Status: the disabled webhook endpoints and how many actions wait on each one's lane.
SELECT s.id, s.endpoint_url, s.consecutive_failures, s.disabled_at, s.disabled_reason,
       (SELECT count(*) FROM {schema}.agent_action a
         WHERE a.lane_key = 'webhook:' || s.id AND a.state IN ('ADMITTED', 'EXECUTING'))
           AS waiting
  FROM {schema}.webhook_subscription s
 WHERE NOT s.enabled
 ORDER BY s.id

-- name: attempts_of_action
-- Operator: every attempt of an action on record, oldest first.
SELECT action_id, epoch, attempt, claimed_at, taken_at, fence_passed_at, ended_at, result,
       reason, provider_ref, error_class
  FROM {schema}.agent_action_attempt
 WHERE action_id = %(id)s
 ORDER BY epoch

-- name: resolution_of_action
-- Operator: what a person recorded about an action.
SELECT action_id, outcome, note, resolved_by, resolved_at
  FROM {schema}.agent_action_resolution WHERE action_id = %(id)s

-- name: links_of_action
-- Operator: the resends and retries made from an action, and the one it was made from.
SELECT from_id, to_id, relation, created_by, created_at
  FROM {schema}.agent_action_link
 WHERE from_id = %(id)s OR to_id = %(id)s
 ORDER BY created_at, from_id, to_id

-- name: parked_payload_exists
-- Operator: whether an ended action still keeps a payload for a resend or retry.
SELECT 1 AS parked FROM {schema}.agent_action_parked_payload WHERE action_id = %(id)s

-- name: parked_payload_of
-- Operator: the payload an ended action parked, for its resend or retry.
SELECT payload FROM {schema}.agent_action_parked_payload WHERE action_id = %(id)s

-- name: drop_parked_payload
-- Operator: a decision was taken on an ended action; its parked payload is no longer needed.
DELETE FROM {schema}.agent_action_parked_payload WHERE action_id = %(id)s

-- name: prune_parked_payloads
-- Maintenance: parked payloads older than their retention are dropped, a batch at a time.
WITH old AS (
    SELECT action_id FROM {schema}.agent_action_parked_payload
     WHERE parked_at < now() - %(retention)s
     ORDER BY parked_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.agent_action_parked_payload p USING old WHERE p.action_id = old.action_id
RETURNING p.action_id

-- name: resolve_action
-- Operator: record a resolution, unless the action has one (then nothing is returned).
INSERT INTO {schema}.agent_action_resolution (action_id, outcome, note, resolved_by)
VALUES (%(id)s, %(outcome)s, %(note)s, %(actor)s)
ON CONFLICT (action_id) DO NOTHING
RETURNING action_id, outcome, note, resolved_by, resolved_at

-- name: link_actions
-- Operator: a resend or retry was made from an action.
INSERT INTO {schema}.agent_action_link (from_id, to_id, relation, created_by)
VALUES (%(from_id)s, %(to_id)s, %(relation)s, %(actor)s)
ON CONFLICT DO NOTHING

-- name: operator_end_waiting
-- Operator: a waiting action in one of `states` ends CANCELLED with `reason`, its payload parked
-- for a retry. A claimer that holds the row makes this wait and then find it EXECUTING (nothing
-- returned); the old row's payload is read in the statement's snapshot (the update's own
-- changes are invisible to its sibling).
WITH ended AS (
    UPDATE {schema}.agent_action a
       SET state = 'CANCELLED', stop_reason = %(reason)s, payload = NULL, ended_at = now()
     WHERE a.id = %(id)s AND a.state = ANY (%(states)s::text[])
    RETURNING a.*
), parked AS (
    INSERT INTO {schema}.agent_action_parked_payload (action_id, payload)
    SELECT o.id, o.payload
      FROM ended JOIN {schema}.agent_action o ON o.id = ended.id
     WHERE o.payload IS NOT NULL
)
SELECT *, false AS created FROM ended

-- name: operator_audit_insert
-- Operator: one audit row.
INSERT INTO {schema}.outbox_operator_audit (actor, verb, action_id, kind, outcome, detail)
VALUES (%(actor)s, %(verb)s, %(action_id)s, %(kind)s, %(outcome)s, %(detail)s)

-- name: operator_audit_recent
-- Operator: the latest audit rows, newest first, of one action or of all.
SELECT id, at, actor, verb, action_id, kind, outcome, detail
  FROM {schema}.outbox_operator_audit
 WHERE %(action_id)s::bigint IS NULL OR action_id = %(action_id)s::bigint
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: kind_exists
-- Operator: whether a kind is declared.
SELECT 1 AS known FROM {schema}.agent_action_kind WHERE name = %(kind)s

-- name: pause_kind
-- Operator: pause a kind (nothing returned when it is paused already).
INSERT INTO {schema}.agent_action_kind_pause (kind, paused_by, note)
VALUES (%(kind)s, %(actor)s, %(note)s)
ON CONFLICT (kind) DO NOTHING
RETURNING kind, paused_by, paused_at, note

-- name: pause_of_kind
-- Operator: one kind's pause.
SELECT kind, paused_by, paused_at, note FROM {schema}.agent_action_kind_pause
 WHERE kind = %(kind)s

-- name: resume_kind
-- Operator: resume a paused kind, and end its provider outage's hold (and probing) now: the
-- claimers take its actions again from their next round (a retry that finds the provider still
-- down holds it again, from the first hold's length).
WITH held AS (
    UPDATE {schema}.agent_action_kind_outage SET held_until = NULL, holds = 0
     WHERE kind = %(kind)s AND holds > 0
    RETURNING kind
), resumed AS (
    DELETE FROM {schema}.agent_action_kind_pause WHERE kind = %(kind)s RETURNING kind
)
SELECT kind FROM resumed UNION SELECT kind FROM held

-- name: vacuum_horizon_holders
-- What holds this database's vacuum horizon back, the longest first: sessions of this database
-- (not this one) with an open snapshot or transaction id, for as long as their transaction has
-- been open, and prepared transactions, for as long as they have been prepared, each listed past
-- `older_than` seconds; replication slots and replicas (hot_standby_feedback without a slot)
-- whose xmin holds it, which carry no time: listed once it is `older_than_xids` transactions
-- old, and an inactive slot at any age (nothing moves its xmin until its replica is back).
-- `xid_age` is how many transactions back each holds it. Until they end, vacuum removes none of
-- the dead rows every action leaves, and each claim steps over all of them. A superuser or a
-- member of pg_read_all_stats (pg_monitor) sees every role's sessions and replicas; any other
-- role, only its own. `limit` NULL lists them all.
SELECT h.holder, h.pid, h.role, h.name, h.state, h.held_s, h.xid_age
  FROM (SELECT 'session' AS holder, a.pid, a.usename::text AS role,
               a.application_name AS name, a.state,
               extract(epoch FROM now() - a.xact_start)::float8 AS held_s,
               greatest(age(a.backend_xmin), age(a.backend_xid)) AS xid_age
          FROM pg_catalog.pg_stat_activity a
         WHERE a.datname = current_database() AND a.pid <> pg_catalog.pg_backend_pid()
           AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
        UNION ALL
        SELECT 'prepared transaction', NULL, p.owner::text, p.gid, 'prepared',
               extract(epoch FROM now() - p.prepared)::float8, age(p.transaction)
          FROM pg_catalog.pg_prepared_xacts p
         WHERE p.database = current_database()
        UNION ALL
        -- A physical slot holds every database's horizon, a logical one its own database's.
        SELECT 'replication slot', s.active_pid, NULL, s.slot_name::text,
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL, age(s.xmin)
          FROM pg_catalog.pg_replication_slots s
         WHERE s.xmin IS NOT NULL AND (s.database IS NULL OR s.database = current_database())
        UNION ALL
        -- A replica's feedback through a slot is the slot's xmin, not its sender's.
        SELECT 'replica', r.pid, r.usename::text, r.application_name, r.state, NULL,
               age(r.backend_xmin)
          FROM pg_catalog.pg_stat_replication r
         WHERE r.backend_xmin IS NOT NULL) h
 WHERE h.held_s > %(older_than)s
    OR (h.holder IN ('replication slot', 'replica')
        AND (h.xid_age >= %(older_than_xids)s OR h.state = 'inactive'))
 ORDER BY h.held_s DESC NULLS LAST, h.xid_age DESC
 LIMIT %(limit)s

-- name: enqueue_notify_off
-- Where outbox.enqueue_notify is off by default for this database (ALTER ROLE or ALTER DATABASE
-- ... SET): each role (NULL: every role) and database (NULL: every database) that sets it, as
-- PostgreSQL keeps them. A connection's, a session's or a transaction's own setting is not
-- listed (no other session can see it).
SELECT CASE WHEN s.setrole = 0 THEN NULL ELSE s.setrole::regrole::text END AS role,
       CASE WHEN s.setdatabase = 0 THEN NULL ELSE current_database()::text END AS database
  FROM pg_catalog.pg_db_role_setting s
 CROSS JOIN LATERAL unnest(s.setconfig) AS c(entry)
 WHERE s.setdatabase IN (0, (SELECT d.oid FROM pg_catalog.pg_database d
                              WHERE d.datname = current_database()))
   AND lower(split_part(c.entry, '=', 1)) = 'outbox.enqueue_notify'
   AND {schema}.agent_action_notify_off(substr(c.entry, strpos(c.entry, '=') + 1))
 ORDER BY 1 NULLS FIRST, 2 NULLS FIRST

-- name: paused_kinds
-- Operator, status: the paused kinds.
SELECT kind, paused_by, paused_at, note FROM {schema}.agent_action_kind_pause ORDER BY kind

-- name: bulk_matching_ids
-- Operator: the ids of the actions a bulk filter matches that its verb applies to, in id order
-- (bulk_count counts them, bulk_apply acts on them). An empty array matches everything; the
-- reason is the stop reason, or the last retry's reason of a waiting action.
SELECT a.id
  FROM {schema}.agent_action a
 WHERE a.state = ANY (%(states)s::text[])
   AND (cardinality(%(kinds)s::text[]) = 0 OR a.kind = ANY (%(kinds)s::text[]))
   AND (cardinality(%(reasons)s::text[]) = 0
        OR coalesce(a.stop_reason, a.retry_reason) = ANY (%(reasons)s::text[]))
   AND (cardinality(%(lanes)s::text[]) = 0 OR a.lane_key = ANY (%(lanes)s::text[]))
   AND (%(created_from)s::timestamptz IS NULL OR a.created_at >= %(created_from)s::timestamptz)
   AND (%(created_to)s::timestamptz IS NULL OR a.created_at < %(created_to)s::timestamptz)
   AND (%(ended_from)s::timestamptz IS NULL OR a.ended_at >= %(ended_from)s::timestamptz)
   AND (%(ended_to)s::timestamptz IS NULL OR a.ended_at < %(ended_to)s::timestamptz)
   AND NOT (%(unresolved)s AND EXISTS (
            SELECT 1 FROM {schema}.agent_action_resolution r WHERE r.action_id = a.id))
   AND NOT (%(not_delivered_only)s AND EXISTS (
            SELECT 1 FROM {schema}.agent_action_resolution r
             WHERE r.action_id = a.id AND r.outcome = 'DELIVERED'))
   AND NOT (%(unlinked)s::text IS NOT NULL AND EXISTS (
            SELECT 1 FROM {schema}.agent_action_link k
             WHERE k.from_id = a.id AND k.relation = %(unlinked)s::text))
 ORDER BY a.id
 LIMIT %(limit)s

-- name: heartbeat
-- Processes: a claimer or worker says it is alive (and how much it has in flight). Its unbroken
-- run of beats goes on from `beating_since` while each comes at most `gap` after the one before
-- (the SET reads the row as it was); a later one (it waited through an outage, or its process
-- stalled) starts a new run (outbox_claimer_may_judge, 0034).
INSERT INTO {schema}.outbox_process
    (process_id, role, host, pid, kinds, started_at, last_seen, beating_since, in_flight)
VALUES (%(process_id)s, %(role)s, %(host)s, %(pid)s, %(kinds)s, %(started_at)s, now(), now(),
        %(in_flight)s)
ON CONFLICT (process_id) DO UPDATE
   SET last_seen = now(), in_flight = excluded.in_flight, kinds = excluded.kinds,
       beating_since = CASE
           WHEN outbox_process.last_seen >= now() - %(gap)s::interval
           THEN coalesce(outbox_process.beating_since, now())
           ELSE now() END

-- name: process_gone
-- Processes: a process that stops cleanly takes its row away.
DELETE FROM {schema}.outbox_process WHERE process_id = %(process_id)s

-- name: live_processes
-- Processes: those whose last heartbeat is at most `within` old, claimers first.
SELECT process_id, role, host, pid, kinds, started_at, last_seen, in_flight,
       extract(epoch FROM now() - last_seen)::float8 AS age
  FROM {schema}.outbox_process
 WHERE last_seen >= now() - %(within)s
 ORDER BY role, host, pid

-- name: prune_stale_processes
-- Maintenance: rows of processes silent for longer than `stale` are deleted.
DELETE FROM {schema}.outbox_process WHERE last_seen < now() - %(stale)s RETURNING process_id

-- name: console_actions_page
-- Console: one page of actions, newest first, under the filters given (NULL = any), below the
-- keyset `before` (an id). Run unprepared, so each filter left NULL folds away at plan time and
-- the planner picks the index of the filters that are set. Never the payload.
SELECT id, kind, state, workspace_id, lane_key, idempotency_key, subject_account_id, attempt,
       max_attempts, stop_reason, retry_reason, available_at, created_at, ended_at
  FROM {schema}.agent_action
 WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
   AND (%(reason)s::text IS NULL OR coalesce(stop_reason, retry_reason) = %(reason)s::text)
   AND (%(lane_key)s::text IS NULL OR lane_key = %(lane_key)s::text)
   AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s::text)
   AND (%(subject)s::text IS NULL OR subject_account_id = %(subject)s::text)
   AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s

-- name: console_actions_count
-- Console: how many actions the filters match (a bulk action's confirmation shows it first).
SELECT count(*) AS n
  FROM {schema}.agent_action
 WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
   AND (%(reason)s::text IS NULL OR coalesce(stop_reason, retry_reason) = %(reason)s::text)
   AND (%(lane_key)s::text IS NULL OR lane_key = %(lane_key)s::text)
   AND (%(idempotency_key)s::text IS NULL OR idempotency_key = %(idempotency_key)s::text)
   AND (%(subject)s::text IS NULL OR subject_account_id = %(subject)s::text)
   AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)

-- name: console_outcomes_per_minute
-- Console: actions that ended in each of the last 60 minutes, by final state (reads
-- ix_agent_action_ended); `minute` counts back from the current one (0 = this minute).
SELECT (extract(epoch FROM date_trunc('minute', now()) - date_trunc('minute', ended_at)) / 60)::int
           AS minute,
       state, count(*) AS n
  FROM {schema}.agent_action
 WHERE ended_at IS NOT NULL AND ended_at >= date_trunc('minute', now()) - interval '59 minutes'
 GROUP BY 1, 2

-- name: console_blocked_lanes
-- Console: lanes whose head cannot run now, oldest head first, each with why: the action that
-- holds the lane and its lease, an erased write's hold, or the head's own wait for a retry or
-- an admission, or its kind is paused; and how many actions wait in the lane (counted up to
-- 1000).
SELECT l.lane_key, l.busy_until, now() AS db_now,
       h.id AS head_id, h.kind AS head_kind, h.state AS head_state, h.attempt AS head_attempt,
       h.max_attempts AS head_max_attempts, h.retry_reason AS head_retry_reason,
       h.available_at AS head_available_at, h.created_at AS head_created_at,
       x.id AS holder_id, x.kind AS holder_kind, x.attempt AS holder_attempt,
       x.lease_until AS holder_lease_until, x.write_started_at AS holder_write_started_at,
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.agent_action w
                               WHERE w.lane_key = l.lane_key
                                 AND w.state IN ('PROPOSED', 'ADMITTED')
                               LIMIT 1000) c) AS waiting,
       p.paused_by AS head_kind_paused_by
  FROM {schema}.agent_action_lane l
  JOIN {schema}.agent_action h ON h.id = l.head_id
  LEFT JOIN {schema}.agent_action x ON x.id = l.executing_id
  LEFT JOIN {schema}.agent_action_kind_pause p ON p.kind = h.kind
 WHERE l.executing_id IS NOT NULL
    OR l.busy_until > now()
    OR h.state = 'PROPOSED'
    OR (h.attempt > 0 AND h.available_at > now())
    OR p.kind IS NOT NULL
 ORDER BY l.head_id
 LIMIT %(limit)s

-- name: console_uncertain_page
-- Console: UNCERTAIN actions, newest first below the keyset `before`, each with the provider's
-- reference of its latest attempt that recorded one (for email the Message-ID) and its
-- resolution, if a person recorded one.
SELECT a.id, a.kind, a.lane_key, a.stop_reason, a.attempt, a.max_attempts, a.ended_at,
       p.provider_ref, r.outcome AS resolution, r.resolved_by, r.resolved_at
  FROM {schema}.agent_action a
  LEFT JOIN LATERAL (SELECT t.provider_ref FROM {schema}.agent_action_attempt t
                      WHERE t.action_id = a.id AND t.provider_ref IS NOT NULL
                      ORDER BY t.epoch DESC LIMIT 1) p ON true
  LEFT JOIN {schema}.agent_action_resolution r ON r.action_id = a.id
 WHERE a.state = 'UNCERTAIN'
   AND (%(unresolved)s::boolean IS NOT TRUE OR r.action_id IS NULL)
   AND (%(before)s::bigint IS NULL OR a.id < %(before)s::bigint)
 ORDER BY a.id DESC
 LIMIT %(limit)s
