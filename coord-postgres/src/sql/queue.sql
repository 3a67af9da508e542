-- Work queues (`@s@` is the quoted schema, `@schema@` its bare name; the
-- tables are in schema.sql). The delivery rule is coord-core's
-- `queue_backend` module docs with turns kept per message
-- (`queue_state::Turns::PerMessage`, which coord-core's queue state
-- machine also runs, as the reference the tests compare with).
--
-- State, per queue name:
-- * queue_messages: one row per message, in lane 0 (main) or 1 (dead).
--   due_at NULL: ready. Otherwise it waits for that time: delayed (owner
--   NULL) or in flight to `owner` until its visibility deadline. A message
--   whose time came is made ready by the next pop of its lane
--   (queue_advance), so "ready" is a plain column and the ready messages
--   are one index range, ordered by (turn, id).
-- * turn: a message's place across groups, given when it becomes ready.
--   V, the lane's current turn, is the lowest turn of its ready messages,
--   or with none ready the highest turn given in the lane (0 for an empty
--   lane). A new message of a group takes V, or, while the group has
--   other messages in the lane, max(V, the group's last turn + 1): so the
--   groups with ready messages take turns one message each, a group that
--   arrives late joins at V, and a group that waited gets no credit. A
--   message given back (a nack, a lapsed or abandoned delivery) keeps its
--   turn, or takes V if that is higher: it stays ahead of its group's
--   later messages, not behind the others' backlog.
-- * queue_groups: one row per group with messages in a lane: the highest
--   turn given to its messages there (deleted when the group's last
--   message leaves the lane; the sweep deletes one left by a race).
-- * queue_dedup: dedup ids until they expire (the sweep deletes expired
--   ones after the grace).
-- Message ids come from the sequence queue_ids and fencing tokens from
-- the schema's `fencing` sequence, so both keep rising for a queue name
-- whose rows all went away. An idle queue (no message, no live dedup id)
-- has no row at all.
--
-- No step takes a lock on the queue: a pop takes the first ready message
-- by (turn, id) that no other pop has locked (FOR UPDATE SKIP LOCKED), so
-- concurrent consumers get distinct messages without waiting for each
-- other. The price is that the order across groups is exact for one
-- consumer at a time and bounded under concurrency: a pop may pass
-- messages other pops hold locked at that moment (at most one per
-- concurrent pop). Pushes of one group are serialized by their group's
-- row (their turns); acks, nacks and extends lock only their message.
-- A pop and the abandon of its consumer are serialized by a
-- transaction-scoped advisory lock on the consumer (shared for pops), so
-- either the abandon sees the delivery and gives it back, or the pop sees
-- the abandon's mark.
--
-- A pop first decides on a plain read, without a lock: when nothing in
-- the lane is due or ready, it is empty and takes no lock, no transaction
-- id and writes nothing (polling waiters), but the lane's waiting mark
-- when its client has a waiter there and the mark is due for renewal.
--
-- Durability: the steps commit asynchronously, so no row lock is held
-- across a WAL flush (a busy queue would otherwise take one step per
-- flush). Before a push, delivery, ack, nack, redrive or purge is
-- reported, the client runs, in the same round trip, a second transaction
-- that writes one WAL record (setval on the sequence queue_flush, which
-- takes a transaction id) and commits durably: its flush covers the
-- step's commit record (WAL is flushed in order), and with it the fencing
-- token drawn. For a pop, that transaction finds the delivery by its
-- owner and does nothing for an empty pop. Extend commits durably itself.
--
-- Wake-ups (NOTIFY on the schema's channel), sent only while somebody
-- waits on the lane: a pop from a client with a waiter there that finds
-- nothing leaves a mark in queue_waiting (queue_mark), and the steps that
-- can make a message deliverable notify (the statement `queue_durable_wake`
-- in src/sql.rs, run after the step) only while the lane's mark is live: `queue:<lane>:<queue>` (one waiter per
-- client) after a push without delay, an ack, an abandon (each while the
-- lane has a ready message), and a push or nack with a delay (the waiter
-- learns when the message comes due) or without; `queue:dead:<queue>`
-- after a pop that moved messages to the dead lane; `queue-all:main:<queue>`
-- (every waiter) after a redrive. A NOTIFY takes a lock of the whole database
-- at commit, which every notifying step of every queue then waits for:
-- a queue nobody waits on sends none.
--
-- No wake-up is lost between a step and a waiter's mark: the wake-up's
-- look at the mark runs after the step committed (in the durable
-- transaction that follows it in the same round trip), and a pop that
-- wrote the mark (a new one, or a renewal: the mark it renews may run
-- out before the renewal commits) looks again once it is committed. So
-- for a message committed after the waiter's look, either the wake-up
-- sees the mark (its read comes after the message's commit) or the look
-- after the mark sees the message. A waiter that sleeps longer than the
-- mark lasts (a poll interval above it) is not covered: it finds the
-- message at its poll.

-- V of lane p_lane (see the header).
CREATE OR REPLACE FUNCTION @s@.queue_v(p_queue text, p_lane smallint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    v bigint;
BEGIN
    -- PL/pgSQL, not SQL: its two statements are planned once per session.
    SELECT m.turn INTO v FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NULL
     ORDER BY m.turn, m.id LIMIT 1;
    IF FOUND THEN
        RETURN v;
    END IF;
    SELECT g.last INTO v FROM @s@.queue_groups g
     WHERE g.queue = p_queue AND g.lane = p_lane
     ORDER BY g.last DESC LIMIT 1;
    RETURN coalesce(v, 0);
END
$fn$;

-- Turns for p_n new messages of group p_grp in lane p_lane at V p_v: the
-- first is returned, the others follow it one by one. Taken under the
-- group's row, so the pushes of one group are serialized here and their
-- turns rise in the order their transactions take it; whether the group
-- has messages is read by a statement that starts once the row is held,
-- so it sees the message of every push that held it before (a statement
-- started before the wait would not, and two pushes would share a turn).
-- Called before the messages are in the lane (a push, a dead-lettering,
-- a redrive) or while they wait there without a turn (a delayed message
-- made ready).
CREATE OR REPLACE FUNCTION @s@.queue_turns(
    p_queue text, p_lane smallint, p_grp text, p_v bigint, p_n bigint)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v_first bigint;
BEGIN
    LOOP
        PERFORM 1 FROM @s@.queue_groups g
          WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane FOR UPDATE;
        IF FOUND THEN
            UPDATE @s@.queue_groups g
               SET last = CASE WHEN EXISTS (
                                   SELECT 1 FROM @s@.queue_messages m
                                    WHERE m.queue = p_queue AND m.grp = p_grp AND m.lane = p_lane)
                               THEN greatest(p_v, g.last + 1) ELSE p_v END + p_n - 1
             WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane
            RETURNING g.last - p_n + 1 INTO v_first;
            RETURN v_first;
        END IF;
        -- No row: make it (a push that made it meanwhile wins; look again).
        INSERT INTO @s@.queue_groups (queue, lane, grp, last)
        VALUES (p_queue, p_lane, p_grp, p_v + p_n - 1)
        ON CONFLICT (queue, grp, lane) DO NOTHING;
        IF FOUND THEN
            RETURN p_v;
        END IF;
    END LOOP;
END
$fn$;

-- A message of group p_grp given back in lane p_lane at turn p_turn:
-- the group's row keeps the highest turn of its messages.
CREATE OR REPLACE FUNCTION @s@.queue_returned(
    p_queue text, p_lane smallint, p_grp text, p_turn bigint)
RETURNS void
LANGUAGE sql AS $fn$
    INSERT INTO @s@.queue_groups AS g (queue, lane, grp, last)
    VALUES (p_queue, p_lane, p_grp, p_turn)
    ON CONFLICT (queue, grp, lane) DO UPDATE SET last = EXCLUDED.last
     WHERE g.last < EXCLUDED.last;
$fn$;

-- Messages of group p_grp left lane p_lane (deleted or moved): delete the
-- group's row once it has none there. Returns whether it still has some.
-- The row is locked before the second look, so a push of the group that
-- took it first is seen (its message committed) and keeps it.
CREATE OR REPLACE FUNCTION @s@.queue_leave(p_queue text, p_lane smallint, p_grp text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF EXISTS (SELECT 1 FROM @s@.queue_messages m
                WHERE m.queue = p_queue AND m.grp = p_grp AND m.lane = p_lane) THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM @s@.queue_groups g
      WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane FOR UPDATE;
    DELETE FROM @s@.queue_groups g
     WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane
       AND NOT EXISTS (SELECT 1 FROM @s@.queue_messages m
                        WHERE m.queue = p_queue AND m.grp = p_grp AND m.lane = p_lane);
    RETURN NOT FOUND;
END
$fn$;

-- Make the messages of lane p_lane whose time came by p_t ready (a
-- delayed message, a lapsed delivery: its owner is cleared, its attempts
-- kept): at most p_limit of them, the earliest due first, so one step
-- stays short however many came due at once. A row another step holds
-- (a racing pop making it ready too, an ack) is waited for and then taken
-- as that step left it (no longer due: left alone), not skipped: a pop
-- that skipped a due message another pop was making ready could find
-- nothing while two were deliverable. A message that had a turn takes
-- max(turn, V); one pushed with a delay gets its first, as a new message
-- of its group, in the order they came due. V is taken once, before the
-- batch. Returns whether none is left due.
CREATE OR REPLACE FUNCTION @s@.queue_advance(
    p_queue text, p_lane smallint, p_t timestamptz, p_limit integer)
RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    v bigint := @s@.queue_v(p_queue, p_lane);
    v_turn bigint;
    n bigint := 0;
    r record;
BEGIN
    FOR r IN
        SELECT m.id, m.grp, m.turn FROM @s@.queue_messages m
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at <= p_t
         ORDER BY m.due_at, m.id LIMIT p_limit FOR UPDATE
    LOOP
        IF r.turn IS NULL THEN
            v_turn := @s@.queue_turns(p_queue, p_lane, r.grp, v, 1);
        ELSE
            v_turn := greatest(r.turn, v);
            PERFORM @s@.queue_returned(p_queue, p_lane, r.grp, v_turn);
        END IF;
        UPDATE @s@.queue_messages m SET due_at = NULL, owner = NULL, turn = v_turn
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = r.id;
        n := n + 1;
    END LOOP;
    RETURN n < p_limit OR NOT EXISTS (
        SELECT 1 FROM @s@.queue_messages m
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at <= p_t);
END
$fn$;

-- Microseconds from p_t until the next time lane p_lane waits for (a
-- delayed message, a delivery's deadline); NULL when it waits for none.
CREATE OR REPLACE FUNCTION @s@.queue_next_us(p_queue text, p_lane smallint, p_t timestamptz)
RETURNS bigint
LANGUAGE sql AS $fn$
    SELECT greatest(0, ceil(extract(epoch FROM (m.due_at - p_t)) * 1000000))::int8
      FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NOT NULL
     ORDER BY m.due_at LIMIT 1;
$fn$;

-- Mark lane p_lane of p_queue as waited on until p_wait_us from now
-- (renewed once less than half of that is left). Returns whether it
-- wrote the mark, new or renewed: the caller then looks again (see the
-- header).
-- Committed asynchronously: a mark lost in a crash is written again by
-- the next empty pop.
CREATE OR REPLACE FUNCTION @s@.queue_mark(p_queue text, p_lane smallint, p_wait_us bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz := clock_timestamp();
    v_until timestamptz;
BEGIN
    SELECT w.until INTO v_until FROM @s@.queue_waiting w
     WHERE w.queue = p_queue AND w.lane = p_lane;
    IF v_until > t + (p_wait_us / 2) * interval '1 microsecond' THEN
        RETURN false;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO @s@.queue_waiting AS w (queue, lane, until)
    VALUES (p_queue, p_lane, t + p_wait_us * interval '1 microsecond')
    ON CONFLICT (queue, lane) DO UPDATE SET until = greatest(w.until, EXCLUDED.until);
    RETURN true;
END
$fn$;

-- Push a message to the main lane. A live dedup id (pushed within its
-- window) makes it a no-op returning the first message's id; two pushes
-- of one dedup id at once meet on its row, and the second is the no-op.
CREATE OR REPLACE FUNCTION @s@.queue_push(
    p_queue text, p_payload bytea, p_delay_us bigint, p_grp text, p_dedup text,
    p_window_us bigint, OUT o_id bigint, OUT o_duplicate boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_turn bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    t := clock_timestamp();
    o_duplicate := false;
    IF p_dedup IS NOT NULL THEN
        SELECT d.id INTO o_id FROM @s@.queue_dedup d
         WHERE d.queue = p_queue AND d.dedup_id = p_dedup AND d.expires_at > t;
        IF FOUND THEN
            o_duplicate := true;
            RETURN;
        END IF;
    END IF;
    o_id := @s@.timeline_next('@s@.queue_ids', 1);
    IF p_dedup IS NOT NULL THEN
        INSERT INTO @s@.queue_dedup AS d (queue, dedup_id, id, expires_at)
        VALUES (p_queue, p_dedup, o_id, t + p_window_us * interval '1 microsecond')
        ON CONFLICT (queue, dedup_id) DO UPDATE
           SET id = EXCLUDED.id, expires_at = EXCLUDED.expires_at
         WHERE d.expires_at <= t;
        IF NOT FOUND THEN
            -- Another push of this id won the row meanwhile.
            SELECT d.id INTO o_id FROM @s@.queue_dedup d
             WHERE d.queue = p_queue AND d.dedup_id = p_dedup;
            o_duplicate := true;
            RETURN;
        END IF;
    END IF;
    IF p_delay_us <= 0 THEN
        v_turn := @s@.queue_turns(p_queue, 0::smallint, p_grp, @s@.queue_v(p_queue, 0::smallint), 1);
    END IF;
    INSERT INTO @s@.queue_messages (queue, lane, id, grp, attempts, enqueued_at, due_at, owner,
                                    turn, payload)
    VALUES (p_queue, 0, o_id, p_grp, 0, t,
            CASE WHEN p_delay_us > 0 THEN t + p_delay_us * interval '1 microsecond' END,
            NULL, v_turn, p_payload);
END
$fn$;

-- One attempt to deliver the next message of lane p_lane to p_owner for
-- p_vis_us (the rule in the header). p_wait_us above 0: the caller's
-- client has a waiter on the lane, so an empty pop marks the lane
-- (queue_mark) for that long; o_marked: it wrote the mark, and the
-- caller must look again (see the header). o_dead: how many messages it
-- moved to the dead lane (the caller wakes that lane's waiters, as a
-- step does, after the commit). Delivered: o_id and the rest, and
-- o_token. Empty: o_id NULL, o_next_us the time until the lane's next
-- due time, if any. p_max: dead-letter (main lane only) a candidate
-- delivered that many times; NULL: never. p_advance: the most messages
-- made ready in one step; when more than that came due, the step makes
-- that many ready and delivers nothing (o_next_us 0: come back at once),
-- since one of those left might be the one the rule picks. p_dead: the
-- most dead letters moved in one step, the same way.
CREATE OR REPLACE FUNCTION @s@.queue_pop(
    p_queue text, p_lane smallint, p_owner bytea, p_vis_us bigint, p_max bigint,
    p_ordered boolean, p_advance integer, p_dead integer, p_wait_us bigint,
    OUT o_id bigint, OUT o_payload bytea, OUT o_grp text, OUT o_attempts integer,
    OUT o_enqueued_ms bigint, OUT o_token bigint, OUT o_next_us bigint,
    OUT o_marked boolean, OUT o_dead integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_due timestamptz;
    v_grp text;
    v_id bigint;
    v_attempts integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    -- The plain read: nothing due and nothing ready is final.
    t := clock_timestamp();
    SELECT m.due_at INTO v_due FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NOT NULL
     ORDER BY m.due_at LIMIT 1;
    IF (v_due IS NULL OR v_due > t) AND NOT EXISTS (
            SELECT 1 FROM @s@.queue_messages m
             WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NULL
               AND (NOT p_ordered OR NOT EXISTS (
                    SELECT 1 FROM @s@.queue_messages o
                     WHERE o.queue = p_queue AND o.grp = m.grp AND o.lane = p_lane
                       AND o.id < m.id))) THEN
        -- NULL when nothing waits for a time (greatest() skips a NULL:
        -- 0 would send a waiter back at once, for as long as it is empty).
        o_next_us := CASE WHEN v_due IS NOT NULL
                          THEN greatest(0, ceil(extract(epoch FROM (v_due - t)) * 1000000))::int8
                     END;
        IF p_wait_us > 0 THEN
            o_marked := @s@.queue_mark(p_queue, p_lane, p_wait_us);
        END IF;
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock_shared(hashtext('coord-queue-consumers:@schema@'),
                                         hashtext(p_queue || ':' || encode(p_owner, 'hex')));
    t := clock_timestamp();
    -- A consumer abandoned (either its abandon sees this delivery and
    -- gives it back, or this sees the mark): a copy of its attempt that
    -- landed late delivers nothing.
    IF EXISTS (SELECT 1 FROM @s@.queue_abandoned a
                WHERE a.queue = p_queue AND a.owner = p_owner AND a.until > t) THEN
        RETURN;
    END IF;
    IF v_due <= t THEN
        IF NOT @s@.queue_advance(p_queue, p_lane, t, p_advance) THEN
            o_next_us := 0;
            RETURN;
        END IF;
    END IF;
    LOOP
        IF p_ordered THEN
            SELECT m.id, m.grp, m.attempts INTO v_id, v_grp, v_attempts
              FROM @s@.queue_messages m
             WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM @s@.queue_messages o
                                WHERE o.queue = p_queue AND o.grp = m.grp AND o.lane = p_lane
                                  AND o.id < m.id)
             ORDER BY m.turn, m.id LIMIT 1 FOR UPDATE SKIP LOCKED;
        ELSE
            SELECT m.id, m.grp, m.attempts INTO v_id, v_grp, v_attempts
              FROM @s@.queue_messages m
             WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NULL
             ORDER BY m.turn, m.id LIMIT 1 FOR UPDATE SKIP LOCKED;
        END IF;
        IF NOT FOUND THEN
            o_next_us := @s@.queue_next_us(p_queue, p_lane, t);
            IF p_wait_us > 0 THEN
                o_marked := @s@.queue_mark(p_queue, p_lane, p_wait_us);
            END IF;
            RETURN;
        END IF;
        IF p_lane = 0 AND p_max IS NOT NULL AND v_attempts >= p_max THEN
            -- Dead-lettered (ready there as a new message of its group,
            -- id, group and attempts kept); the next candidate is
            -- considered, but after p_dead of them the step ends
            -- (committing those) and the consumer comes back at once, so
            -- a long run of them stays in short steps.
            UPDATE @s@.queue_messages m
               SET lane = 1,
                   turn = @s@.queue_turns(p_queue, 1::smallint, v_grp,
                                          @s@.queue_v(p_queue, 1::smallint), 1)
             WHERE m.queue = p_queue AND m.lane = 0 AND m.id = v_id;
            PERFORM @s@.queue_leave(p_queue, 0::smallint, v_grp);
            o_dead := coalesce(o_dead, 0) + 1;
            IF o_dead >= p_dead THEN
                o_next_us := 0;
                RETURN;
            END IF;
            CONTINUE;
        END IF;
        o_token := @s@.fencing_next();
        UPDATE @s@.queue_messages m
           SET attempts = least(m.attempts, 2147483646) + 1,
               due_at = t + p_vis_us * interval '1 microsecond',
               owner = p_owner,
               step = NULL
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = v_id
        RETURNING m.id, m.payload, m.grp, m.attempts,
                  floor(extract(epoch FROM m.enqueued_at) * 1000)::int8
             INTO o_id, o_payload, o_grp, o_attempts, o_enqueued_ms;
        RETURN;
    END LOOP;
END
$fn$;

-- Set the deadline of message p_id to now + p_vis_us iff it is in flight
-- to p_owner and not lapsed. The message's row lock is taken first and
-- the clock read only then, so an extend that waited for it past the
-- deadline resurrects nothing. An extend stamped at or before the last
-- one applied for p_owner is a late copy: it changes nothing and returns
-- 2 (else 1 if extended, 0 if not held). Commits durably.
CREATE OR REPLACE FUNCTION @s@.queue_extend(
    p_queue text, p_lane smallint, p_id bigint, p_owner bytea, p_vis_us bigint, p_stamp bigint)
RETURNS smallint
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_due timestamptz;
    v_step bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    SELECT m.due_at, m.step INTO v_due, v_step FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id AND m.owner = p_owner
       FOR UPDATE;
    t := clock_timestamp();
    IF NOT FOUND OR v_due IS NULL OR v_due <= t THEN
        RETURN 0;
    END IF;
    IF p_stamp <= v_step THEN
        RETURN 2;
    END IF;
    UPDATE @s@.queue_messages m
       SET due_at = t + p_vis_us * interval '1 microsecond', step = p_stamp
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id;
    RETURN 1;
END
$fn$;

-- Delete message p_id iff it is in flight to p_owner and not lapsed (on
-- the row as locked, on the clock read then).
CREATE OR REPLACE FUNCTION @s@.queue_ack(
    p_queue text, p_lane smallint, p_id bigint, p_owner bytea)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_grp text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id
       AND m.owner = p_owner AND m.due_at > clock_timestamp()
    RETURNING m.grp INTO v_grp;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM @s@.queue_leave(p_queue, p_lane, v_grp);
    RETURN true;
END
$fn$;

-- Give message p_id back iff it is in flight to p_owner and not lapsed:
-- ready again after p_delay_us (at once: 0, at max(turn, V)), attempts
-- kept.
CREATE OR REPLACE FUNCTION @s@.queue_nack(
    p_queue text, p_lane smallint, p_id bigint, p_owner bytea, p_delay_us bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_grp text;
    v_turn bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    IF p_delay_us > 0 THEN
        UPDATE @s@.queue_messages m
           SET owner = NULL, due_at = clock_timestamp() + p_delay_us * interval '1 microsecond'
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id
           AND m.owner = p_owner AND m.due_at > clock_timestamp()
        RETURNING m.grp INTO v_grp;
    ELSE
        UPDATE @s@.queue_messages m
           SET owner = NULL, due_at = NULL,
               turn = greatest(m.turn, @s@.queue_v(p_queue, p_lane))
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id
           AND m.owner = p_owner AND m.due_at > clock_timestamp()
        RETURNING m.grp, m.turn INTO v_grp, v_turn;
    END IF;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF v_turn IS NOT NULL THEN
        PERFORM @s@.queue_returned(p_queue, p_lane, v_grp, v_turn);
    END IF;
    RETURN true;
END
$fn$;

-- Abandon the pop attempts of consumer p_owner, whose outcome no caller
-- saw: remember it until now + p_keep_us (an attempt of it landing
-- meanwhile delivers nothing), and give back at once a message in flight
-- to it, its attempt count as before (nobody saw that delivery).
CREATE OR REPLACE FUNCTION @s@.queue_abandon(
    p_queue text, p_lane smallint, p_owner bytea, p_keep_us bigint)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_grp text;
    v_turn bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queue-consumers:@schema@'),
                                  hashtext(p_queue || ':' || encode(p_owner, 'hex')));
    t := clock_timestamp();
    INSERT INTO @s@.queue_abandoned AS a (queue, owner, until)
    VALUES (p_queue, p_owner, t + p_keep_us * interval '1 microsecond')
    ON CONFLICT (queue, owner) DO UPDATE SET until = greatest(a.until, EXCLUDED.until);
    UPDATE @s@.queue_messages m
       SET owner = NULL, due_at = NULL, attempts = greatest(m.attempts - 1, 0),
           turn = greatest(m.turn, @s@.queue_v(p_queue, p_lane))
     WHERE m.ctid = (SELECT x.ctid FROM @s@.queue_messages x
                      WHERE x.owner = p_owner AND x.queue = p_queue AND x.lane = p_lane
                        AND x.due_at > t
                      LIMIT 1)
    RETURNING m.grp, m.turn INTO v_grp, v_turn;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM @s@.queue_returned(p_queue, p_lane, v_grp, v_turn);
END
$fn$;

-- Move up to p_limit dead letters not in flight, lowest id first, to the
-- main lane: ready at once as new messages of their groups (in id order,
-- V taken once), attempts reset, ids kept. Returns how many.
CREATE OR REPLACE FUNCTION @s@.queue_redrive(p_queue text, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    t timestamptz;
    v bigint := @s@.queue_v(p_queue, 0::smallint);
    v_n bigint := 0;
    v_next bigint;
    r record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    t := clock_timestamp();
    -- Lapsed deliveries are not in flight any more (not yet made ready
    -- by a pop of the dead lane, perhaps).
    FOR r IN
        SELECT x.grp, array_agg(x.id ORDER BY x.id) AS ids, min(x.id) AS first_id
          FROM (SELECT m.id, m.grp FROM @s@.queue_messages m
                 WHERE m.queue = p_queue AND m.lane = 1 AND (m.owner IS NULL OR m.due_at <= t)
                 ORDER BY m.id LIMIT p_limit FOR UPDATE SKIP LOCKED) x
         GROUP BY x.grp ORDER BY min(x.id)
    LOOP
        v_next := @s@.queue_turns(p_queue, 0::smallint, r.grp, v, cardinality(r.ids));
        UPDATE @s@.queue_messages m
           SET lane = 0, attempts = 0, due_at = NULL, owner = NULL,
               turn = v_next + array_position(r.ids, m.id) - 1
         WHERE m.queue = p_queue AND m.lane = 1 AND m.id = ANY (r.ids);
        PERFORM @s@.queue_leave(p_queue, 1::smallint, r.grp);
        v_n := v_n + cardinality(r.ids);
    END LOOP;
    RETURN v_n;
END
$fn$;

-- Delete up to p_limit messages of the queue (both lanes), or, once it
-- has none, up to p_limit of its dedup ids; the client calls it again
-- until o_done, so each step stays short whatever the queue holds. A
-- queue with fewer than p_limit of each is purged in one step (group rows
-- go with their last message).
CREATE OR REPLACE FUNCTION @s@.queue_purge(
    p_queue text, p_limit integer, OUT o_deleted bigint, OUT o_done boolean)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    r record;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    o_deleted := 0;
    FOR r IN
        WITH d AS (
            DELETE FROM @s@.queue_messages m
             WHERE m.ctid = ANY (ARRAY(
                   SELECT x.ctid FROM @s@.queue_messages x WHERE x.queue = p_queue
                    LIMIT p_limit))
            RETURNING m.lane, m.grp)
        SELECT d.lane, d.grp, count(*) AS n FROM d GROUP BY d.lane, d.grp
    LOOP
        o_deleted := o_deleted + r.n;
        PERFORM @s@.queue_leave(p_queue, r.lane, r.grp);
    END LOOP;
    -- (A row changed meanwhile is not at its ctid any more: it is left
    -- for the next step, so "done" is what is left, not a count.)
    IF o_deleted < p_limit AND NOT EXISTS (
            SELECT 1 FROM @s@.queue_messages m WHERE m.queue = p_queue) THEN
        DELETE FROM @s@.queue_dedup d
         WHERE d.ctid = ANY (ARRAY(
               SELECT x.ctid FROM @s@.queue_dedup x WHERE x.queue = p_queue LIMIT p_limit));
        o_done := NOT EXISTS (SELECT 1 FROM @s@.queue_dedup d WHERE d.queue = p_queue);
    ELSE
        o_done := false;
    END IF;
END
$fn$;
