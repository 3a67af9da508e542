-- Work queues (`@s@` is the quoted schema, `@schema@` its bare name; the
-- tables are in schema.sql). The delivery rule is coord-core's
-- `queue_backend` module docs; coord-memory's queue.rs is its reference.
--
-- State, per queue name:
-- * queue_messages: one row per message, in lane 0 (main) or 1 (dead).
--   due_at NULL: ready. Otherwise it waits for that time: delayed (owner
--   NULL) or in flight to `owner` until its visibility deadline. A message
--   whose time came is made ready by the next step of its lane
--   (queue_advance, the memory model's `advance`), so "ready" is a plain
--   column and the ready messages of a group are an index range.
-- * queue_groups: one row per group that has messages in a lane: its turn
--   (virtual clock), first_id (its lowest id in the lane, any state) and
--   ready_id (its lowest ready id, NULL when none). The next delivery is
--   the row with the lowest (turn, ready_id) among those with a ready_id
--   (ordered groups: among those whose ready_id is their first_id), one
--   index probe. The row is deleted when the group's last message leaves
--   the lane, so the group comes back at the lane's clock.
-- * queue_lanes: the lane's clock V and how many groups it has, while it
--   has any (deleted with its last group: with no group left, V only
--   shifts every later turn by the same amount, which changes no
--   decision).
-- * queue_dedup: dedup ids until they expire (the sweep deletes expired
--   ones after the grace).
-- Message ids come from the sequence queue_ids and fencing tokens from
-- the schema's `fencing` sequence, so both keep rising for a queue name
-- whose rows all went away. An idle queue (no message, no live dedup id)
-- has no row at all.
--
-- Every step that writes runs under the queue's lock, a transaction-scoped
-- advisory lock on (hashtext('coord-queues:<schema>'), hashtext(queue)),
-- with the database clock read after it: pushes, pops of both lanes, acks,
-- nacks, redrives and purges of one queue are serialized, so the global
-- turn order across groups holds exactly and concurrent consumers get
-- distinct messages. Tokens are drawn under it, so they rise per queue
-- over deliveries of both lanes. (FOR UPDATE SKIP LOCKED would let
-- consumers pass a locked candidate and take a later one: not the rule.)
-- Extend does not take it: it only moves a live delivery's deadline
-- later, under the message's row lock (no other step changes a live
-- delivery without the queue lock).
--
-- A pop first decides on a plain read, without the lock: when nothing in
-- the lane is due and no group has a candidate, it is empty and takes no
-- lock, no transaction id and writes nothing (polling waiters).
--
-- Durability: the steps under the lock commit asynchronously, so the lock
-- is never held across a WAL flush (a busy queue would otherwise take one
-- step per flush). Before a push, delivery, ack, nack, redrive or purge is
-- reported, the client runs, in the same round trip, a second transaction
-- that writes one WAL record (setval on the sequence queue_flush, which
-- takes a transaction id) and commits durably: its flush covers the step's
-- commit record (WAL is flushed in order), and with it the fencing token
-- drawn. For a pop, that transaction finds the delivery by its owner and
-- does nothing for an empty pop. Extend commits durably itself.
--
-- Wake-ups (NOTIFY on the schema's channel): `queue:<lane>:<queue>` (one
-- waiter per client) on a push without delay, a nack (with a delay too:
-- the waiter learns when the message comes due), and
-- an ack whose group still has messages in the lane (an ordered group may
-- deliver its next one); `queue-all:main:<queue>` (every waiter) on a
-- redrive that moved messages.

-- Message p_id of group p_grp entered lane p_lane (ready, or waiting):
-- make or update its group's row. A new group starts at the lane's clock.
CREATE OR REPLACE FUNCTION @s@.queue_enter(
    p_queue text, p_lane smallint, p_grp text, p_id bigint, p_ready boolean)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_first bigint;
    v_ready bigint;
    v_clock bigint;
BEGIN
    SELECT g.first_id, g.ready_id INTO v_first, v_ready FROM @s@.queue_groups g
     WHERE g.queue = p_queue AND g.lane = p_lane AND g.grp = p_grp;
    IF NOT FOUND THEN
        SELECT l.clock INTO v_clock FROM @s@.queue_lanes l
         WHERE l.queue = p_queue AND l.lane = p_lane;
        IF NOT FOUND THEN
            v_clock := 0;
            INSERT INTO @s@.queue_lanes (queue, lane, clock, groups) VALUES (p_queue, p_lane, 0, 1);
        ELSE
            UPDATE @s@.queue_lanes l SET groups = l.groups + 1
             WHERE l.queue = p_queue AND l.lane = p_lane;
        END IF;
        INSERT INTO @s@.queue_groups (queue, lane, grp, turn, first_id, ready_id)
        VALUES (p_queue, p_lane, p_grp, v_clock + 1, p_id, CASE WHEN p_ready THEN p_id END);
    ELSIF p_id < v_first OR (p_ready AND (v_ready IS NULL OR p_id < v_ready)) THEN
        UPDATE @s@.queue_groups g
           SET first_id = least(g.first_id, p_id),
               ready_id = CASE WHEN p_ready THEN least(g.ready_id, p_id) ELSE g.ready_id END
         WHERE g.queue = p_queue AND g.lane = p_lane AND g.grp = p_grp;
    END IF;
END
$fn$;

-- Messages of group p_grp left lane p_lane (deleted or moved), the lowest
-- of them p_after: bring the group's row up to date, or delete it (and
-- the lane's clock with the lane's last group). Returns whether the group
-- still has messages there. Ids below p_after did not change, so a new
-- lowest id (or lowest ready id) is searched for above it only: the
-- index entries of the rows that left in this same transaction (not yet
-- dead to other scans) are below or at it when one message leaves, so a
-- long run of dead letters moved in one step costs no rescan of them.
CREATE OR REPLACE FUNCTION @s@.queue_leave(
    p_queue text, p_lane smallint, p_grp text, p_after bigint)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    v_first bigint;
    v_ready bigint;
    v_new_first bigint;
    v_new_ready bigint;
BEGIN
    SELECT g.first_id, g.ready_id INTO v_first, v_ready FROM @s@.queue_groups g
     WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_new_first := v_first;
    IF v_first >= p_after THEN
        SELECT m.id INTO v_new_first FROM @s@.queue_messages m
         WHERE m.queue = p_queue AND m.grp = p_grp AND m.lane = p_lane AND m.id > p_after
         ORDER BY m.id LIMIT 1;
    END IF;
    IF v_new_first IS NULL THEN
        DELETE FROM @s@.queue_groups g
         WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane;
        UPDATE @s@.queue_lanes l SET groups = l.groups - 1
         WHERE l.queue = p_queue AND l.lane = p_lane;
        DELETE FROM @s@.queue_lanes l
         WHERE l.queue = p_queue AND l.lane = p_lane AND l.groups <= 0;
        RETURN false;
    END IF;
    v_new_ready := v_ready;
    IF v_ready >= p_after THEN
        SELECT m.id INTO v_new_ready FROM @s@.queue_messages m
         WHERE m.queue = p_queue AND m.grp = p_grp AND m.lane = p_lane AND m.due_at IS NULL
           AND m.id > p_after
         ORDER BY m.id LIMIT 1;
    END IF;
    IF (v_new_first, v_new_ready) IS DISTINCT FROM (v_first, v_ready) THEN
        UPDATE @s@.queue_groups g SET first_id = v_new_first, ready_id = v_new_ready
         WHERE g.queue = p_queue AND g.grp = p_grp AND g.lane = p_lane;
    END IF;
    RETURN true;
END
$fn$;

-- Make the messages of lane p_lane whose time came by p_t ready (a
-- delayed message, a lapsed delivery: its owner is cleared, its attempts
-- kept), and their groups' ready_id with them: at most p_limit of them,
-- the earliest due first, so one step stays short however many came due
-- at once. Returns whether none is left due. Rows are picked by ctid (a
-- TID scan: sequential scans are off in here, or a table without
-- statistics yet, taken for a few rows, is scanned whole filtering each
-- row against the batch) and groups updated one by one by key: plans
-- that stay linear whatever the planner estimates (a join of the batch
-- with the table was a quadratic nested loop before statistics). A row
-- rewritten meanwhile (by an extend, which takes no queue lock) is no
-- longer at its ctid and is left alone, as it should be: it was extended
-- while live.
CREATE OR REPLACE FUNCTION @s@.queue_advance(
    p_queue text, p_lane smallint, p_t timestamptz, p_limit integer)
RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    v_grps text[];
    v_ids bigint[];
    n bigint;
BEGIN
    WITH a AS (
        UPDATE @s@.queue_messages m SET due_at = NULL, owner = NULL
         WHERE m.ctid = ANY (ARRAY(
               SELECT x.ctid FROM @s@.queue_messages x
                WHERE x.queue = p_queue AND x.lane = p_lane AND x.due_at <= p_t
                ORDER BY x.due_at LIMIT p_limit))
        RETURNING m.grp, m.id)
    SELECT array_agg(x.grp), array_agg(x.id), coalesce(sum(x.n), 0)::int8
      INTO v_grps, v_ids, n
      FROM (SELECT a.grp, min(a.id) AS id, count(*) AS n FROM a GROUP BY a.grp) x;
    FOR i IN 1..coalesce(cardinality(v_grps), 0) LOOP
        UPDATE @s@.queue_groups g SET ready_id = least(g.ready_id, v_ids[i])
         WHERE g.queue = p_queue AND g.grp = v_grps[i] AND g.lane = p_lane
           AND (g.ready_id IS NULL OR g.ready_id > v_ids[i]);
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

-- Push a message to the main lane. A live dedup id (pushed within its
-- window) makes it a no-op returning the first message's id.
CREATE OR REPLACE FUNCTION @s@.queue_push(
    p_queue text, p_payload bytea, p_delay_us bigint, p_grp text, p_dedup text,
    p_window_us bigint, p_channel text,
    OUT o_id bigint, OUT o_duplicate boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
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
        ON CONFLICT (queue, dedup_id) DO UPDATE SET id = EXCLUDED.id, expires_at = EXCLUDED.expires_at;
    END IF;
    INSERT INTO @s@.queue_messages (queue, lane, id, grp, attempts, enqueued_at, due_at, owner, payload)
    VALUES (p_queue, 0, o_id, p_grp, 0, t,
            CASE WHEN p_delay_us > 0 THEN t + p_delay_us * interval '1 microsecond' END,
            NULL, p_payload);
    PERFORM @s@.queue_enter(p_queue, 0::smallint, p_grp, o_id, p_delay_us <= 0);
    IF p_delay_us <= 0 THEN
        PERFORM pg_notify(p_channel, 'queue:main:' || p_queue);
    END IF;
END
$fn$;

-- One attempt to deliver the next message of lane p_lane to p_owner for
-- p_vis_us (the rule in the header). Delivered: o_id and the rest, and
-- o_token. Empty: o_id NULL, o_next_us the time until the lane's next
-- due time, if any. p_max: dead-letter (main lane only) a candidate
-- delivered that many times; NULL: never. p_advance: the most messages
-- made ready in one step; when more than that came due, the step makes
-- that many ready and delivers nothing (o_next_us 0: come back at once),
-- since one of those left might be the one the rule picks. p_dead: the
-- most dead letters moved in one step, the same way.
CREATE OR REPLACE FUNCTION @s@.queue_pop(
    p_queue text, p_lane smallint, p_owner bytea, p_vis_us bigint, p_max bigint,
    p_ordered boolean, p_advance integer, p_dead integer,
    OUT o_id bigint, OUT o_payload bytea, OUT o_grp text, OUT o_attempts integer,
    OUT o_enqueued_ms bigint, OUT o_token bigint, OUT o_next_us bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_due timestamptz;
    v_grp text;
    v_turn bigint;
    v_id bigint;
    v_attempts integer;
    v_moved integer := 0;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    -- The plain read: nothing due and no candidate is final.
    t := clock_timestamp();
    SELECT m.due_at INTO v_due FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.due_at IS NOT NULL
     ORDER BY m.due_at LIMIT 1;
    IF (v_due IS NULL OR v_due > t) AND NOT (CASE WHEN p_ordered
            THEN EXISTS (SELECT 1 FROM @s@.queue_groups g
                          WHERE g.queue = p_queue AND g.lane = p_lane AND g.ready_id = g.first_id)
            ELSE EXISTS (SELECT 1 FROM @s@.queue_groups g
                          WHERE g.queue = p_queue AND g.lane = p_lane AND g.ready_id IS NOT NULL)
            END) THEN
        o_next_us := greatest(0, ceil(extract(epoch FROM (v_due - t)) * 1000000))::int8;
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
    t := clock_timestamp();
    -- A consumer abandoned (under this lock, so either its abandon sees
    -- this delivery and gives it back, or this sees the mark): a copy of
    -- its attempt that landed late delivers nothing.
    IF EXISTS (SELECT 1 FROM @s@.queue_abandoned a
                WHERE a.queue = p_queue AND a.owner = p_owner AND a.until > t) THEN
        RETURN;
    END IF;
    IF NOT @s@.queue_advance(p_queue, p_lane, t, p_advance) THEN
        o_next_us := 0;
        RETURN;
    END IF;
    LOOP
        IF p_ordered THEN
            SELECT g.grp, g.turn, g.ready_id INTO v_grp, v_turn, v_id FROM @s@.queue_groups g
             WHERE g.queue = p_queue AND g.lane = p_lane AND g.ready_id = g.first_id
             ORDER BY g.turn, g.ready_id LIMIT 1;
        ELSE
            SELECT g.grp, g.turn, g.ready_id INTO v_grp, v_turn, v_id FROM @s@.queue_groups g
             WHERE g.queue = p_queue AND g.lane = p_lane AND g.ready_id IS NOT NULL
             ORDER BY g.turn, g.ready_id LIMIT 1;
        END IF;
        IF NOT FOUND THEN
            o_next_us := @s@.queue_next_us(p_queue, p_lane, t);
            RETURN;
        END IF;
        SELECT m.attempts INTO v_attempts FROM @s@.queue_messages m
         WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = v_id;
        IF p_lane = 0 AND p_max IS NOT NULL AND v_attempts >= p_max THEN
            -- Dead-lettered (ready there, id, group, attempts kept); the
            -- next candidate is considered, but after p_dead of them
            -- the step ends (committing those) and the consumer comes
            -- back at once, so a long run of them stays in short steps.
            UPDATE @s@.queue_messages m SET lane = 1
             WHERE m.queue = p_queue AND m.lane = 0 AND m.id = v_id;
            PERFORM @s@.queue_leave(p_queue, 0::smallint, v_grp, v_id);
            PERFORM @s@.queue_enter(p_queue, 1::smallint, v_grp, v_id, true);
            v_moved := v_moved + 1;
            IF v_moved >= p_dead THEN
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
        -- V := max(V, turn(g)); turn(g) := V + 1.
        UPDATE @s@.queue_lanes l SET clock = greatest(l.clock, v_turn)
         WHERE l.queue = p_queue AND l.lane = p_lane
        RETURNING l.clock INTO v_turn;
        UPDATE @s@.queue_groups g
           SET turn = v_turn + 1,
               ready_id = (SELECT m.id FROM @s@.queue_messages m
                            WHERE m.queue = p_queue AND m.lane = p_lane AND m.grp = v_grp
                              AND m.due_at IS NULL AND m.id > v_id
                            ORDER BY m.id LIMIT 1)
         WHERE g.queue = p_queue AND g.lane = p_lane AND g.grp = v_grp;
        RETURN;
    END LOOP;
END
$fn$;

-- The group of message p_id if it is in flight to p_owner and not lapsed
-- at p_t, else NULL. Looked up by the primary key alone (the checks are
-- made here, not in the statement's WHERE, so no other index fits it).
-- Under the queue's lock a message so held stays so until the step ends:
-- only an extend changes it meanwhile, moving its deadline later.
CREATE OR REPLACE FUNCTION @s@.queue_held(
    p_queue text, p_lane smallint, p_id bigint, p_owner bytea, p_t timestamptz)
RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    v_grp text;
    v_owner bytea;
    v_due timestamptz;
BEGIN
    SELECT m.grp, m.owner, m.due_at INTO v_grp, v_owner, v_due FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id;
    IF v_owner IS DISTINCT FROM p_owner OR v_due IS NULL OR v_due <= p_t THEN
        RETURN NULL;
    END IF;
    RETURN v_grp;
END
$fn$;

-- Set the deadline of message p_id to now + p_vis_us iff it is in flight
-- to p_owner and not lapsed. No queue lock: the message's row lock is
-- taken first and the clock read only then, so an extend that waited for
-- it past the deadline resurrects nothing. An extend stamped at or before
-- the last one applied for p_owner is a late copy: it changes nothing and
-- returns 2 (else 1 if extended, 0 if not held). Commits durably.
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

-- Delete message p_id iff it is in flight to p_owner and not lapsed.
CREATE OR REPLACE FUNCTION @s@.queue_ack(
    p_queue text, p_lane smallint, p_id bigint, p_owner bytea, p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_grp text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
    t := clock_timestamp();
    v_grp := @s@.queue_held(p_queue, p_lane, p_id, p_owner, t);
    IF v_grp IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM @s@.queue_messages m
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id;
    IF @s@.queue_leave(p_queue, p_lane, v_grp, p_id) THEN
        PERFORM pg_notify(p_channel, 'queue:' || CASE WHEN p_lane = 0 THEN 'main' ELSE 'dead' END
                                     || ':' || p_queue);
    END IF;
    RETURN true;
END
$fn$;

-- Give message p_id back iff it is in flight to p_owner and not lapsed:
-- ready again after p_delay_us (at once: 0), attempts kept.
CREATE OR REPLACE FUNCTION @s@.queue_nack(
    p_queue text, p_lane smallint, p_id bigint, p_owner bytea, p_delay_us bigint, p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_grp text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
    t := clock_timestamp();
    v_grp := @s@.queue_held(p_queue, p_lane, p_id, p_owner, t);
    IF v_grp IS NULL THEN
        RETURN false;
    END IF;
    UPDATE @s@.queue_messages m
       SET owner = NULL,
           due_at = CASE WHEN p_delay_us > 0 THEN t + p_delay_us * interval '1 microsecond' END
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = p_id;
    IF p_delay_us <= 0 THEN
        PERFORM @s@.queue_enter(p_queue, p_lane, v_grp, p_id, true);
    END IF;
    -- With a delay too: a waiter learns when the message comes due.
    PERFORM pg_notify(p_channel, 'queue:' || CASE WHEN p_lane = 0 THEN 'main' ELSE 'dead' END
                                 || ':' || p_queue);
    RETURN true;
END
$fn$;

-- Abandon the pop attempts of consumer p_owner, whose outcome no caller
-- saw: remember it until now + p_keep_us (an attempt of it landing
-- meanwhile delivers nothing), and give back at once a message in flight
-- to it, its attempt count as before (nobody saw that delivery).
CREATE OR REPLACE FUNCTION @s@.queue_abandon(
    p_queue text, p_lane smallint, p_owner bytea, p_keep_us bigint, p_channel text)
RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    t timestamptz;
    v_id bigint;
    v_grp text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
    t := clock_timestamp();
    INSERT INTO @s@.queue_abandoned AS a (queue, owner, until)
    VALUES (p_queue, p_owner, t + p_keep_us * interval '1 microsecond')
    ON CONFLICT (queue, owner) DO UPDATE SET until = greatest(a.until, EXCLUDED.until);
    SELECT m.id, m.grp INTO v_id, v_grp FROM @s@.queue_messages m
     WHERE m.owner = p_owner AND m.queue = p_queue AND m.lane = p_lane AND m.due_at > t
     LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE @s@.queue_messages m
       SET owner = NULL, due_at = NULL, attempts = greatest(m.attempts - 1, 0)
     WHERE m.queue = p_queue AND m.lane = p_lane AND m.id = v_id;
    PERFORM @s@.queue_enter(p_queue, p_lane, v_grp, v_id, true);
    PERFORM pg_notify(p_channel, 'queue:' || CASE WHEN p_lane = 0 THEN 'main' ELSE 'dead' END
                                 || ':' || p_queue);
END
$fn$;

-- Move up to p_limit dead letters not in flight, lowest id first, to the
-- main lane: ready at once, attempts reset, ids kept. Returns how many.
CREATE OR REPLACE FUNCTION @s@.queue_redrive(p_queue text, p_limit integer, p_channel text)
RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    t timestamptz;
    v_grps text[];
    v_ids bigint[];
    v_n bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
    t := clock_timestamp();
    -- Lapsed deliveries are not in flight any more (not yet made ready
    -- by a pop of the dead lane, perhaps).
    WITH moved AS (
        UPDATE @s@.queue_messages m SET lane = 0, attempts = 0, due_at = NULL, owner = NULL
         WHERE m.ctid = ANY (ARRAY(
               SELECT x.ctid FROM @s@.queue_messages x
                WHERE x.queue = p_queue AND x.lane = 1 AND (x.owner IS NULL OR x.due_at <= t)
                ORDER BY x.id LIMIT p_limit))
        RETURNING m.grp, m.id),
    per AS (SELECT moved.grp, min(moved.id) AS id, count(*) AS n FROM moved GROUP BY moved.grp)
    SELECT array_agg(per.grp), array_agg(per.id), coalesce(sum(per.n), 0)::int8
      INTO v_grps, v_ids, v_n FROM per;
    FOR i IN 1..coalesce(cardinality(v_grps), 0) LOOP
        PERFORM @s@.queue_leave(p_queue, 1::smallint, v_grps[i], v_ids[i]);
        PERFORM @s@.queue_enter(p_queue, 0::smallint, v_grps[i], v_ids[i], true);
    END LOOP;
    IF v_n > 0 THEN
        PERFORM pg_notify(p_channel, 'queue-all:main:' || p_queue);
    END IF;
    RETURN v_n;
END
$fn$;

-- Delete up to p_limit messages of the queue (both lanes), or, once it
-- has none, up to p_limit of its dedup ids; the client calls it again
-- until o_done, so each step stays short whatever the queue holds. A
-- queue with fewer than p_limit of each is purged in one step (groups
-- and clocks go with their last message).
CREATE OR REPLACE FUNCTION @s@.queue_purge(
    p_queue text, p_limit integer, OUT o_deleted bigint, OUT o_done boolean)
LANGUAGE plpgsql SET enable_seqscan = off SET jit = off AS $fn$
DECLARE
    v_lanes smallint[];
    v_grps text[];
    v_ids bigint[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM pg_advisory_xact_lock(hashtext('coord-queues:@schema@'), hashtext(p_queue));
    WITH d AS (
        DELETE FROM @s@.queue_messages m
         WHERE m.ctid = ANY (ARRAY(
               SELECT x.ctid FROM @s@.queue_messages x WHERE x.queue = p_queue LIMIT p_limit))
        RETURNING m.lane, m.grp, m.id),
    per AS (SELECT d.lane, d.grp, min(d.id) AS id FROM d GROUP BY d.lane, d.grp)
    SELECT array_agg(per.lane), array_agg(per.grp), array_agg(per.id), (SELECT count(*) FROM d)
      INTO v_lanes, v_grps, v_ids, o_deleted FROM per;
    FOR i IN 1..coalesce(cardinality(v_grps), 0) LOOP
        PERFORM @s@.queue_leave(p_queue, v_lanes[i], v_grps[i], v_ids[i]);
    END LOOP;
    -- (A row an extend rewrote meanwhile is not at its ctid any more: it
    -- is left for the next step, so "done" is what is left, not a count.)
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
