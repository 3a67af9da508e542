-- The sweep (`@s@` is the quoted schema): deletes the state of idle
-- names, at most p_limit rows per table and call, skipping rows another
-- transaction has locked (a grant, check or arrival in progress decides
-- on its own; the row goes in a later sweep). Every condition is checked
-- on the locked, newest row version, on the database clock. Returns the
-- number of rows deleted. Idle means:
-- * claims: the last grant's expiry more than the grace ago, released
--   (owner NULL: release frees the row in place) or not.
--   Fencing stays monotonic: a name's next row is taken by an UPDATE that
--   draws its token after this deletion (src/sql/claims.sql). A row
--   stays while a mark of an owner that left holds on it, and
--   for the grace after.
-- * limiter_state: the stored state decides exactly like no state, and
--   has done so for the grace: fixed window ended; sliding-window counter
--   two windows on; GCRA theoretical arrival time passed; sliding log: no
--   entry younger than the retention (its entries go with it). The grace
--   covers the database clock stepping back.
-- * barriers: no member (the last generation completed or every member
--   withdrew) for the grace, or no arrival nor withdrawal for p_abandon_us
--   (members that never came back).
-- * semaphore_holders, semaphore_queue, semaphore_left: grants, queue
--   places and marks of owners that left, expired more than the grace ago
--   (a name has no other state).
-- * queue_dedup, queue_abandoned, queue_waiting: dedup ids, abandoned
--   consumers and waiting marks expired more than the grace ago (a queue's other rows go with its
--   last message); queue_groups: a group's row with no message left in
--   its lane.
-- The deletions are committed without waiting for the WAL flush: a crash
-- may bring some back, for the next sweep. Sequential scans are off in
-- here: each DELETE picks its rows by `ctid = ANY (...)`, and
-- on a table without statistics yet (taken for a few rows) the planner
-- chose a sequential scan filtering every row against the whole batch
-- (rows x 1,000 comparisons) over the TID scan; where no index fits, the
-- sequential scan is still used.
CREATE OR REPLACE FUNCTION @s@.sweep(p_grace_us bigint, p_abandon_us bigint, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    now_ts timestamptz := clock_timestamp();
    now_us bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    grace interval := p_grace_us * interval '1 microsecond';
    n bigint;
    total bigint := 0;
    v_groups tid[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM @s@.claims WHERE ctid = ANY (ARRAY(
        SELECT c.ctid FROM @s@.claims c
         WHERE c.expires_at < now_ts - grace
           AND (c.left_until IS NULL
                OR NOT EXISTS (SELECT 1 FROM unnest(c.left_until) u WHERE u >= now_ts - grace))
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.limiter_state WHERE ctid = ANY (ARRAY(
        SELECT x.ctid FROM @s@.limiter_state x
         WHERE x.algorithm <> 'sliding_log'
           AND (x.q_window IS NULL OR CASE x.algorithm
                WHEN 'fixed_window' THEN now_us - p_grace_us >= x.window_start + x.q_window
                WHEN 'sliding_window' THEN now_us - p_grace_us >= x.window_start + 2 * x.q_window
                WHEN 'gcra' THEN x.tat_x IS NULL OR x.q_limit IS NULL
                              OR x.tat_x <= (now_us - p_grace_us)::numeric * x.q_limit
                ELSE false END)
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    WITH idle AS (
        SELECT x.ctid AS id, x.key FROM @s@.limiter_state x
         WHERE x.algorithm = 'sliding_log'
           AND NOT EXISTS (SELECT 1 FROM @s@.limiter_log l
                            WHERE l.key = x.key
                              AND l.at > now_us - p_grace_us - coalesce(x.retain, 0))
         LIMIT p_limit FOR UPDATE OF x SKIP LOCKED),
    entries AS (DELETE FROM @s@.limiter_log l USING idle WHERE l.key = idle.key RETURNING 1)
    DELETE FROM @s@.limiter_state x USING idle WHERE x.ctid = idle.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.barriers WHERE ctid = ANY (ARRAY(
        SELECT b.ctid FROM @s@.barriers b
         WHERE (cardinality(b.members) = 0 AND b.updated_at < now_ts - grace)
            OR b.updated_at < now_ts - p_abandon_us * interval '1 microsecond'
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    DELETE FROM @s@.semaphore_holders WHERE ctid = ANY (ARRAY(
        SELECT h.ctid FROM @s@.semaphore_holders h
         WHERE h.expires_at < now_ts - grace
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.semaphore_queue WHERE ctid = ANY (ARRAY(
        SELECT q.ctid FROM @s@.semaphore_queue q
         WHERE q.expires_at < now_ts - grace
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.semaphore_left WHERE ctid = ANY (ARRAY(
        SELECT l.ctid FROM @s@.semaphore_left l
         WHERE l.expires_at < now_ts - grace
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.queue_dedup WHERE ctid = ANY (ARRAY(
        SELECT d.ctid FROM @s@.queue_dedup d
         WHERE d.expires_at < now_ts - grace
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.queue_abandoned WHERE ctid = ANY (ARRAY(
        SELECT a.ctid FROM @s@.queue_abandoned a
         WHERE a.until < now_ts - grace
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    DELETE FROM @s@.queue_waiting WHERE ctid = ANY (ARRAY(
        SELECT w.ctid FROM @s@.queue_waiting w
         WHERE w.until < now_ts - grace
         LIMIT p_limit FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;

    -- Group rows whose group has no message left in the lane (a row the
    -- step that took the last one did not delete, racing a push): locked
    -- first, then checked again in a statement of its own, so a push
    -- that held the row is seen with its message.
    v_groups := ARRAY(
        SELECT g.ctid FROM @s@.queue_groups g
         WHERE NOT EXISTS (SELECT 1 FROM @s@.queue_messages m
                            WHERE m.queue = g.queue AND m.grp = g.grp AND m.lane = g.lane)
         LIMIT p_limit FOR UPDATE SKIP LOCKED);
    DELETE FROM @s@.queue_groups g
     WHERE g.ctid = ANY (v_groups)
       AND NOT EXISTS (SELECT 1 FROM @s@.queue_messages m
                        WHERE m.queue = g.queue AND m.grp = g.grp AND m.lane = g.lane);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    RETURN total;
END
$fn$;
