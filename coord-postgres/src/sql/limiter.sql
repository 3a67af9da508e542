-- Rate limiting: one call of limiter_check per check. `@s@` is the quoted
-- schema. Times are microseconds since the Unix epoch on the DATABASE
-- clock, read with clock_timestamp() AFTER the row lock is taken, so a
-- check that waited for the lock decides on the time it got it, never on
-- an older one, and no window ever moves backwards.
--
-- The state row carries the quota it was last written under (q_limit,
-- q_window), so a quota change carries the state over and never grants a
-- fresh allowance:
-- * sliding log: entries are kept while younger than `retain`, the largest
--   window the key was checked with since it was last idle; a check counts
--   the entries younger than ITS window against ITS limit.
-- * fixed window: (window_start, q_window, cur). While the stored window
--   runs, a check counts in it against its own limit; once it has ended, a
--   new window aligned for the checking quota starts at 0.
-- * sliding-window counter: same window -> unchanged (a limit change only
--   changes the comparison); another window -> the estimate under the old
--   window (rounded up) becomes the current count of the new window's
--   current slot, with no previous count.
-- * GCRA: tat_x is the theoretical arrival time times q_limit (exact
--   numeric). A quota change rescales the backlog: owed requests =
--   backlog / (W_old / L_old), new TAT = now + owed * (W_new / L_new),
--   rounded up.
--
-- A check first decides on an unlocked read; a denial found there is
-- final (what was admitted stays admitted until time passes) and writes
-- nothing. Otherwise it decides again on the row locked FOR UPDATE and
-- records the admission.
CREATE OR REPLACE FUNCTION @s@.limiter_check(
    p_algo text, p_key text, p_limit bigint, p_window bigint, p_cost bigint,
    OUT allowed boolean, OUT remaining bigint, OUT retry_after bigint, OUT reset_after bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    now_us bigint;
    st @s@.limiter_state%ROWTYPE;
    seen boolean := false;
    used bigint;
    acc bigint;
    e record;
    ret bigint;
    el bigint;
    est numeric;
    lim_x numeric;
    now_x numeric;
    tat numeric;
    new_tat numeric;
    room bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    IF p_algo NOT IN ('sliding_log', 'fixed_window', 'sliding_window', 'gcra') THEN
        RAISE EXCEPTION 'coord: unknown limiter algorithm %', p_algo;
    END IF;
    FOR pass IN 1..2 LOOP
        retry_after := 0;
        IF pass = 1 THEN
            SELECT * INTO st FROM @s@.limiter_state x
             WHERE x.algorithm = p_algo AND x.key = p_key;
            IF NOT FOUND THEN
                CONTINUE;
            END IF;
            seen := true;
        ELSE
            -- Limiter decisions are not grants: commit them without waiting
            -- for the WAL flush, so a hot key is not held to one check per
            -- fsync. A crash may forget the last fraction of a second of
            -- admissions.
            PERFORM set_config('synchronous_commit', 'off', true);
            -- The sweep may have deleted the row (idle: its state decides
            -- like no state) since pass 1 read it, or between the insert
            -- and the lock: insert until the lock finds one.
            LOOP
                IF NOT seen THEN
                    INSERT INTO @s@.limiter_state AS x (algorithm, key) VALUES (p_algo, p_key)
                    ON CONFLICT (algorithm, key) DO NOTHING;
                END IF;
                SELECT * INTO st FROM @s@.limiter_state x
                 WHERE x.algorithm = p_algo AND x.key = p_key FOR UPDATE;
                EXIT WHEN FOUND;
                seen := false;
            END LOOP;
        END IF;
        -- The clock, read after the state (and, in pass 2, its lock).
        now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

        IF p_algo = 'sliding_log' THEN
            ret := p_window;
            IF st.retain IS NOT NULL AND EXISTS (
                   SELECT 1 FROM @s@.limiter_log l
                    WHERE l.key = p_key AND l.at > now_us - st.retain) THEN
                ret := greatest(st.retain, p_window);
            END IF;
            st.retain := ret;
            SELECT coalesce(sum(l.cost), 0) INTO used FROM @s@.limiter_log l
             WHERE l.key = p_key AND l.at > now_us - p_window;
            allowed := used + p_cost <= p_limit;
            IF allowed AND pass = 2 THEN
                DELETE FROM @s@.limiter_log l WHERE l.key = p_key AND l.at <= now_us - ret;
                INSERT INTO @s@.limiter_log (key, at, cost) VALUES (p_key, now_us, p_cost);
                used := used + p_cost;
            END IF;
            IF NOT allowed THEN
                acc := 0;
                FOR e IN SELECT l.at, l.cost FROM @s@.limiter_log l
                          WHERE l.key = p_key AND l.at > now_us - p_window
                          ORDER BY l.at, l.id LOOP
                    acc := acc + e.cost;
                    IF used - acc + p_cost <= p_limit THEN
                        retry_after := greatest(1, e.at + p_window - now_us);
                        EXIT;
                    END IF;
                END LOOP;
                IF retry_after = 0 THEN
                    retry_after := p_window;
                END IF;
            END IF;
            remaining := greatest(0, p_limit - used);
            SELECT coalesce(max(l.at) + p_window - now_us, 0) INTO reset_after
              FROM @s@.limiter_log l WHERE l.key = p_key AND l.at > now_us - p_window;
            reset_after := greatest(0, reset_after);
        ELSIF p_algo = 'fixed_window' THEN
            -- A stored window still running (or a clock that stepped back
            -- into it) counts; otherwise a new aligned window starts.
            IF st.q_window IS NULL OR now_us >= st.window_start + st.q_window THEN
                st.window_start := (now_us / p_window) * p_window;
                st.q_window := p_window;
                st.cur := 0;
            END IF;
            el := greatest(1, st.window_start + st.q_window - now_us);
            allowed := st.cur + p_cost <= p_limit;
            IF allowed THEN
                st.cur := st.cur + p_cost;
            ELSE
                retry_after := el;
            END IF;
            remaining := greatest(0, p_limit - st.cur);
            reset_after := CASE WHEN st.cur > 0 THEN el ELSE 0 END;
        ELSIF p_algo = 'sliding_window' THEN
            IF st.q_window IS NOT NULL THEN
                -- Roll forward under the stored window; never backwards.
                IF (now_us / st.q_window) * st.q_window > st.window_start THEN
                    IF (now_us / st.q_window) * st.q_window = st.window_start + st.q_window THEN
                        st.prev := st.cur;
                    ELSE
                        st.prev := 0;
                    END IF;
                    st.cur := 0;
                    st.window_start := (now_us / st.q_window) * st.q_window;
                END IF;
                IF st.q_window <> p_window THEN
                    -- The estimate under the old window, rounded up, is the
                    -- new window's current count.
                    el := least(st.q_window, greatest(0, now_us - st.window_start));
                    st.cur := st.cur + (st.prev * (st.q_window - el) + st.q_window - 1) / st.q_window;
                    st.prev := 0;
                    st.window_start := (now_us / p_window) * p_window;
                    st.q_window := p_window;
                END IF;
            ELSE
                st.window_start := (now_us / p_window) * p_window;
                st.q_window := p_window;
                st.cur := 0;
                st.prev := 0;
            END IF;
            el := least(p_window - 1, greatest(0, now_us - st.window_start));
            -- Exact: estimate x window = prev x (window - elapsed) + cur x window.
            est := st.prev::numeric * (p_window - el) + st.cur::numeric * p_window;
            lim_x := p_limit::numeric * p_window;
            allowed := est + p_cost::numeric * p_window <= lim_x;
            IF allowed THEN
                st.cur := st.cur + p_cost;
                est := est + p_cost::numeric * p_window;
            ELSIF st.prev > 0 AND p_limit - st.cur - p_cost >= 0 THEN
                -- The previous window's weight decays enough within this one:
                -- prev x (window - e) <= (limit - cur - cost) x window.
                retry_after := greatest(1, ceil(p_window - (p_limit - st.cur - p_cost)::numeric * p_window / st.prev)::bigint - el);
            ELSE
                -- Only in the next window, where this window's count is the
                -- previous one.
                retry_after := greatest(1, (p_window - el)
                    + CASE WHEN st.cur > 0
                           THEN greatest(0, ceil(p_window - (p_limit - p_cost)::numeric * p_window / st.cur)::bigint)
                           ELSE 0 END);
            END IF;
            remaining := greatest(0, floor((lim_x - est) / p_window)::bigint);
            reset_after := CASE WHEN st.cur > 0 THEN (p_window - el) + p_window
                                WHEN st.prev > 0 THEN p_window - el
                                ELSE 0 END;
        ELSE
            -- GCRA: emission interval window/limit, burst tolerance one
            -- window, so a full bucket admits `limit` at once, then one per
            -- interval. Scaled by the limit, the interval is the window.
            now_x := now_us::numeric * p_limit;
            IF st.tat_x IS NULL OR st.q_limit IS NULL OR st.q_window IS NULL THEN
                tat := now_x;
            ELSIF st.q_limit = p_limit AND st.q_window = p_window THEN
                tat := st.tat_x;
            ELSE
                -- backlog x L_old / W_old = owed requests; x W_new = the new
                -- backlog x L_new; rounded up.
                tat := st.tat_x - now_us::numeric * st.q_limit;
                IF tat > 0 THEN
                    tat := now_x + div(tat * p_window + st.q_window - 1, st.q_window::numeric);
                ELSE
                    tat := now_x;
                END IF;
            END IF;
            tat := greatest(tat, now_x);
            new_tat := tat + p_cost::numeric * p_window;
            lim_x := p_window::numeric * p_limit;
            allowed := new_tat - lim_x <= now_x;
            IF allowed THEN
                st.tat_x := new_tat;
                st.q_limit := p_limit;
                st.q_window := p_window;
                remaining := greatest(0, floor((now_x + lim_x - new_tat) / p_window)::bigint);
                reset_after := greatest(0, ceil((new_tat - now_x) / p_limit)::bigint);
            ELSE
                retry_after := greatest(1, ceil((new_tat - lim_x - now_x) / p_limit)::bigint);
                remaining := greatest(0, floor((now_x + lim_x - tat) / p_window)::bigint);
                reset_after := greatest(0, ceil((tat - now_x) / p_limit)::bigint);
            END IF;
        END IF;

        IF NOT allowed THEN
            RETURN;
        END IF;
        IF pass = 2 THEN
            IF p_algo <> 'gcra' THEN
                st.q_limit := p_limit;
            END IF;
            UPDATE @s@.limiter_state x
               SET window_start = st.window_start, cur = st.cur, prev = st.prev,
                   q_limit = st.q_limit, q_window = st.q_window, retain = st.retain,
                   tat_x = st.tat_x
             WHERE x.algorithm = p_algo AND x.key = p_key;
            RETURN;
        END IF;
    END LOOP;
END
$fn$;
