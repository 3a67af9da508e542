-- Semaphores (`@s@` is the quoted schema, `@schema@` its bare name):
-- one row per grant in semaphore_holders, one row per queued waiter in
-- semaphore_queue (tables in schema.sql). There is no row per name: the
-- total a name is in use with is the `total` of its live rows (all of
-- them carry the same one), so an idle name has no state at all once its
-- rows are released or swept.
--
-- Every decision that writes is made under the name's semaphore lock, a
-- transaction-scoped advisory lock on (hashtext('coord-semaphores:<schema>'),
-- hashtext(name)), with the database clock read after it is taken: grants,
-- queue places, releases and force releases of one name are serialized,
-- and each grant draws its fencing token from the schema's `fencing`
-- sequence under that lock, so tokens rise per name in grant order and
-- never repeat (the sequence is WAL-logged; rows can come and go).
-- Extend does not take it: it only moves a live row's expiry, under the
-- row lock.
--
-- FIFO: queue places are numbered from the sequence `semaphore_places`.
-- A request is granted iff its permits plus those of every live queued
-- request ahead of it (all of the queue when it has no place) fit into
-- the free permits (total minus the live grants). A refused attempt with
-- p_queue takes (or renews) its place; without, it writes nothing.
--
-- An attempt first decides on a plain read, without the lock: a refusal
-- found there that needs no write (a single attempt; a waiter whose place
-- is fresh) is final and writes nothing, so polling waiters take no
-- transaction id and no WAL flush. This is safe: a release after that
-- read sees the waiter's place (it was there before the read) and wakes
-- it if it can be granted. Anything else is decided again under the lock.
--
-- Durability: grants, places and releases commit asynchronously, so the
-- name's lock is never held across a WAL flush (grants of a hot name
-- would otherwise be serialized one per flush). Before a grant is
-- reported, the client runs `semaphore_durable` (src/sql.rs) in the same
-- round trip: a no-op update of the grant's own row in a transaction
-- that commits synchronously, whose flush covers the grant's commit record
-- (WAL is flushed in order), and with it the fencing token drawn. A crash
-- before that flush may forget the grant, but no client was told of it.
-- A lost place or release only costs time (a place is taken again, the
-- permits return at their TTL). Extend and force release are durable.
--
-- Wake-ups: a release, force release, or an attempt that pruned expired
-- rows sends NOTIFY `semaphore:<owner hex>:<name>` for every live queued
-- waiter that can now be granted (the longest prefix of the queue that
-- fits) and asked for it (`wake`: its client LISTENs). A release nobody
-- waits for sends none.
--
-- Late attempts: an attempt whose client gave up on it (call timeout,
-- cancellation) may still reach the server after its owner's release
-- (the acquire timed out or was cancelled and left, or a retry was
-- granted and the permits released). Applied then, it would queue a
-- place nobody waits for (holding up every later waiter until it lapses)
-- or take permits nobody releases. So every attempt and release carries
-- its client's stamp (rising within a process), and the release of an
-- owner one of whose attempts went unanswered writes a row in
-- semaphore_left with its stamp, for p_left_ttl_us. An attempt of that
-- owner stamped before it is refused and writes nothing (decided on the
-- plain read too: the row, once there, only lapses). Attempts stamped
-- after the release (an owner used again through the raw trait) are
-- served as usual. Releases after answered attempts only (the common
-- case) write no such row. The row is committed asynchronously like the
-- release: a crash may forget it, and a late attempt landing after the
-- crash (or more than the left TTL late) is an ordinary attempt again.

-- Notify the queued waiters of p_name that can be granted now.
CREATE OR REPLACE FUNCTION @s@.semaphore_wake(p_name text, p_channel text, p_t timestamptz)
RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify(p_channel, 'semaphore:' || encode(g.owner, 'hex') || ':' || p_name)
       FROM (SELECT q.owner, q.wake, q.total,
                    sum(q.permits) OVER (ORDER BY q.place) AS need
               FROM @s@.semaphore_queue q
              WHERE q.name = p_name AND q.expires_at > p_t) g
      WHERE g.wake
        AND g.need <= g.total - (SELECT coalesce(sum(h.permits), 0) FROM @s@.semaphore_holders h
                                  WHERE h.name = p_name AND h.expires_at > p_t);
END
$fn$;

-- Whether p_owner left p_name (a live `semaphore_left` mark) after
-- p_stamp: an extend so stamped is a late copy overtaken by a later step
-- of its owner. VOLATILE plpgsql, so its query takes a snapshot of its
-- own when it runs: called by the extend statement once it holds the
-- owner's grant row lock, it sees a mark committed by the step whose lock
-- it waited for (the statement's own snapshot, taken before, would not).
CREATE OR REPLACE FUNCTION @s@.semaphore_is_left(p_name text, p_owner bytea, p_stamp bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN EXISTS (SELECT 1 FROM @s@.semaphore_left l
                    WHERE l.name = p_name AND l.owner = p_owner AND l.stamp > p_stamp
                      AND l.expires_at > clock_timestamp());
END
$fn$;

-- One attempt. granted: the grant's fencing token. Otherwise held_us: how
-- long until the next live grant, or live place ahead, expires (at most
-- p_refresh_us, so a waiter renews its place in time; at most
-- p_head_poll_us for a polling waiter among the first four in line that
-- fits once the grants return). in_use: the total the name is in use
-- with, when it is not p_total (nothing changed). p_stamp: the client's
-- stamp of this attempt; an attempt stamped before its owner left (see
-- "Late attempts") is refused (held_us p_refresh_us) and changes nothing.
-- p_metadata: stored with a new grant (NULL: none); a retry of a live
-- grant keeps it as it is.
CREATE OR REPLACE FUNCTION @s@.semaphore_acquire(
    p_name text, p_owner bytea, p_permits integer, p_total integer, p_ttl_us bigint,
    p_queue boolean, p_wake boolean, p_channel text, p_queue_ttl_us bigint, p_refresh_us bigint,
    p_head_poll_us bigint, p_stamp bigint, p_metadata bytea,
    OUT granted bigint, OUT held_us bigint, OUT in_use integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    ttl interval := p_ttl_us * interval '1 microsecond';
    queue_ttl interval := p_queue_ttl_us * interval '1 microsecond';
    refresh interval := p_refresh_us * interval '1 microsecond';
    n bigint;
    pruned bigint := 0;
    tok bigint;
    used bigint;
    held_until timestamptz;
    my_place bigint;
    my_expires timestamptz;
    ahead bigint;
    ahead_places bigint;
    ahead_until timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    FOR pass IN 1..2 LOOP
        IF pass = 2 THEN
            -- Asynchronous commit: the lock is released without waiting
            -- for the WAL flush (the client makes a grant durable in its
            -- own next transaction, `semaphore_durable`), so grants of
            -- one name are not held to one per flush.
            PERFORM set_config('synchronous_commit', 'off', true);
            PERFORM pg_advisory_xact_lock(hashtext('coord-semaphores:@schema@'), hashtext(p_name));
        END IF;
        t := clock_timestamp();
        IF pass = 2 THEN
            DELETE FROM @s@.semaphore_holders h WHERE h.name = p_name AND h.expires_at <= t;
            GET DIAGNOSTICS n = ROW_COUNT;
            pruned := pruned + n;
            DELETE FROM @s@.semaphore_queue q WHERE q.name = p_name AND q.expires_at <= t;
            GET DIAGNOSTICS n = ROW_COUNT;
            pruned := pruned + n;
            DELETE FROM @s@.semaphore_left l WHERE l.name = p_name AND l.expires_at <= t;
        END IF;
        -- A late copy of an attempt of an owner that left since: stale.
        IF EXISTS (SELECT 1 FROM @s@.semaphore_left l
                    WHERE l.name = p_name AND l.owner = p_owner AND l.stamp > p_stamp
                      AND l.expires_at > t) THEN
            held_us := p_refresh_us;
            EXIT;
        END IF;
        -- The total binds while the name has live grants or places.
        SELECT x.total INTO in_use FROM (
            (SELECT h.total FROM @s@.semaphore_holders h
              WHERE h.name = p_name AND h.expires_at > t LIMIT 1)
            UNION ALL
            (SELECT q.total FROM @s@.semaphore_queue q
              WHERE q.name = p_name AND q.expires_at > t LIMIT 1)) x
         LIMIT 1;
        IF in_use IS NOT NULL AND in_use <> p_total THEN
            EXIT;
        END IF;
        in_use := NULL;
        -- A retry of a grant whose reply was lost: the same grant.
        SELECT h.fencing INTO tok FROM @s@.semaphore_holders h
         WHERE h.name = p_name AND h.owner = p_owner AND h.expires_at > t;
        IF FOUND THEN
            IF pass = 1 THEN
                CONTINUE;
            END IF;
            UPDATE @s@.semaphore_holders h SET expires_at = t + ttl
             WHERE h.name = p_name AND h.owner = p_owner;
            granted := tok;
            EXIT;
        END IF;
        SELECT coalesce(sum(h.permits), 0), min(h.expires_at) INTO used, held_until
          FROM @s@.semaphore_holders h WHERE h.name = p_name AND h.expires_at > t;
        my_place := NULL;
        my_expires := NULL;
        SELECT q.place, q.expires_at INTO my_place, my_expires FROM @s@.semaphore_queue q
         WHERE q.name = p_name AND q.owner = p_owner AND q.expires_at > t;
        SELECT coalesce(sum(q.permits), 0), count(*), min(q.expires_at)
          INTO ahead, ahead_places, ahead_until
          FROM @s@.semaphore_queue q
         WHERE q.name = p_name AND q.expires_at > t AND (my_place IS NULL OR q.place < my_place);
        IF ahead + p_permits <= p_total - used THEN
            IF pass = 1 THEN
                CONTINUE;
            END IF;
            IF my_place IS NOT NULL THEN
                DELETE FROM @s@.semaphore_queue q WHERE q.name = p_name AND q.owner = p_owner;
            END IF;
            INSERT INTO @s@.semaphore_holders (name, owner, permits, total, fencing, expires_at,
                                               metadata)
            VALUES (p_name, p_owner, p_permits, p_total, @s@.fencing_next(), t + ttl,
                    p_metadata)
            RETURNING fencing INTO granted;
            EXIT;
        END IF;
        -- Refused.
        held_us := greatest(0, (extract(epoch FROM (least(t + refresh, held_until, ahead_until) - t))
                                * 1000000)::int8);
        -- A polling waiter (no NOTIFY reaches it) near the head, that fits
        -- once the grants return, comes back soon: only it may take the
        -- permits then, so it must not leave them idle for a poll interval.
        IF p_queue AND NOT p_wake AND ahead_places < 4 AND ahead + p_permits <= p_total THEN
            held_us := least(held_us, p_head_poll_us);
        END IF;
        IF p_queue AND my_place IS NULL THEN
            IF pass = 1 THEN
                CONTINUE;
            END IF;
            INSERT INTO @s@.semaphore_queue (name, owner, permits, total, place, wake, expires_at)
            VALUES (p_name, p_owner, p_permits, p_total, @s@.timeline_next('@s@.semaphore_places', 2), p_wake,
                    t + queue_ttl);
        ELSIF p_queue AND my_expires < t + queue_ttl - refresh / 2 THEN
            -- Renewed at most every refresh / 2, not on every poll.
            IF pass = 1 THEN
                CONTINUE;
            END IF;
            UPDATE @s@.semaphore_queue q SET expires_at = t + queue_ttl, wake = p_wake
             WHERE q.name = p_name AND q.owner = p_owner;
        END IF;
        EXIT;
    END LOOP;
    IF pruned > 0 THEN
        PERFORM @s@.semaphore_wake(p_name, p_channel, t);
    END IF;
END
$fn$;

-- Compare-and-delete p_owner's grant (true iff it was live) and its
-- place in the queue, if any; wakes the waiters that can now be granted.
-- With p_left_stamp (one of the owner's attempts went unanswered), marks
-- the owner as left at that stamp for p_left_ttl_us (see "Late attempts").
CREATE OR REPLACE FUNCTION @s@.semaphore_release(
    p_name text, p_owner bytea, p_channel text, p_left_stamp bigint, p_left_ttl_us bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    held boolean;
    n bigint;
    changed bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    -- A release lost in a crash only returns the permits at their TTL:
    -- committed without waiting for the WAL flush (a grant that used them
    -- is flushed, and WAL is flushed in order).
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-semaphores:@schema@'), hashtext(p_name));
    t := clock_timestamp();
    DELETE FROM @s@.semaphore_holders h WHERE h.name = p_name AND h.owner = p_owner
    RETURNING h.expires_at > t INTO held;
    GET DIAGNOSTICS changed = ROW_COUNT;
    DELETE FROM @s@.semaphore_queue q
     WHERE q.name = p_name AND (q.owner = p_owner OR q.expires_at <= t);
    GET DIAGNOSTICS n = ROW_COUNT;
    changed := changed + n;
    DELETE FROM @s@.semaphore_holders h WHERE h.name = p_name AND h.expires_at <= t;
    GET DIAGNOSTICS n = ROW_COUNT;
    changed := changed + n;
    IF p_left_stamp IS NOT NULL THEN
        INSERT INTO @s@.semaphore_left AS l (name, owner, stamp, expires_at)
        VALUES (p_name, p_owner, p_left_stamp, t + p_left_ttl_us * interval '1 microsecond')
        ON CONFLICT (name, owner) DO UPDATE
           SET stamp = greatest(l.stamp, EXCLUDED.stamp),
               expires_at = greatest(l.expires_at, EXCLUDED.expires_at);
    END IF;
    IF changed > 0 THEN
        PERFORM @s@.semaphore_wake(p_name, p_channel, t);
    END IF;
    RETURN coalesce(held, false);
END
$fn$;

-- Delete every grant of p_name, whoever holds it (true iff one was live);
-- queued places stay. Wakes the waiters that can now be granted.
CREATE OR REPLACE FUNCTION @s@.semaphore_force_release(p_name text, p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    removed boolean;
    n bigint;
    changed bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('coord-semaphores:@schema@'), hashtext(p_name));
    t := clock_timestamp();
    WITH d AS (DELETE FROM @s@.semaphore_holders h WHERE h.name = p_name
               RETURNING h.expires_at > t AS live)
    SELECT coalesce(bool_or(d.live), false), count(*) INTO removed, changed FROM d;
    DELETE FROM @s@.semaphore_queue q WHERE q.name = p_name AND q.expires_at <= t;
    GET DIAGNOSTICS n = ROW_COUNT;
    changed := changed + n;
    IF changed > 0 THEN
        PERFORM @s@.semaphore_wake(p_name, p_channel, t);
    END IF;
    RETURN removed;
END
$fn$;
