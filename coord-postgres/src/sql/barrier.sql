-- Barriers (`@s@` is the quoted schema name). One row per barrier, locked
-- FOR UPDATE by every change, so each decision is made on the newest row.
-- p_arrival identifies one wait (the same on its retries): an arrival id of
-- the generation that completed last returns that generation as complete
-- and changes nothing, so a retried completing arrival never joins the
-- next generation. A withdrawn arrival id (withdrawn_ids: the tombstones of
-- the open generation, a late copy of an arrival whose wait gave up)
-- changes nothing and returns generation -2. A member arriving with a
-- second id (a second wait) counts once; each id is withdrawn on its own.
-- Each participant's newest arrival that passed is remembered by its stamp
-- (an arrival id's first 16 hex digits, µs, rising within a process): an
-- arrival of the participant stamped no later, and not in the open
-- generation, is a late copy of a wait that has ended, whose generation
-- may have completed long ago, and counts nowhere (generation -2, as a
-- tombstone). Stamps more than 30 s older than the newest are forgotten.
CREATE OR REPLACE FUNCTION @s@.barrier_arrive(
    p_name text, p_parties integer, p_participant text, p_channel text, p_arrival text,
    OUT generation bigint, OUT complete boolean, OUT started_with integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    b @s@.barriers%ROWTYPE;
    member boolean;
    i integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    -- The sweep may delete an idle row between the insert and the lock:
    -- then insert again. A new row's generation comes from the fencing
    -- sequence, above every generation the name ever had.
    LOOP
        INSERT INTO @s@.barriers AS x (name, parties, generation, born, updated_at)
        SELECT p_name, p_parties, g.v, g.v, clock_timestamp()
          FROM (SELECT @s@.fencing_next() AS v
                 WHERE NOT EXISTS (SELECT 1 FROM @s@.barriers y WHERE y.name = p_name)) g
        ON CONFLICT (name) DO NOTHING;
        SELECT * INTO b FROM @s@.barriers x WHERE x.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    started_with := p_parties;
    IF b.passed_generation IS NOT NULL AND p_arrival = ANY (b.passed_ids) THEN
        generation := b.passed_generation;
        complete := true;
        RETURN;
    END IF;
    IF p_arrival = ANY (b.withdrawn_ids) THEN
        generation := -2;
        complete := false;
        RETURN;
    END IF;
    i := array_position(b.latest_participants, p_participant);
    IF i IS NOT NULL AND NOT p_arrival = ANY (b.member_ids)
       AND ('x' || substr(p_arrival, 1, 16))::bit(64)::bigint <= b.latest_stamps[i] THEN
        generation := -2;
        complete := false;
        RETURN;
    END IF;
    -- An open generation with nobody in it that was drawn on an earlier
    -- timeline (this server is a promoted standby) may have completed on
    -- the old primary in WAL this one never got: it gets a number of this
    -- timeline, so no generation is reported twice. Nobody waits on it,
    -- and a wait on an older generation still finds it complete.
    IF cardinality(b.members) = 0 AND b.generation < @s@.fencing_floor() THEN
        b.generation := @s@.fencing_next();
        UPDATE @s@.barriers x SET generation = b.generation WHERE x.name = p_name;
    END IF;
    generation := b.generation;
    complete := false;
    IF cardinality(b.members) > 0 AND b.parties <> p_parties THEN
        started_with := b.parties;
        RETURN;
    END IF;
    IF p_arrival = ANY (b.member_ids) THEN
        RETURN;
    END IF;
    member := p_participant = ANY (b.members);
    b.members := array_append(b.members, p_participant);
    b.member_ids := array_append(b.member_ids, p_arrival);
    IF NOT member
       AND (SELECT count(DISTINCT m) FROM unnest(b.members) AS u(m)) >= p_parties THEN
        -- Every participant that passed: its newest stamp, merged with the
        -- others'; stamps more than 30 s older than the newest go.
        SELECT coalesce(array_agg(l.p), '{}'), coalesce(array_agg(l.s), '{}')
          INTO b.latest_participants, b.latest_stamps
          FROM (SELECT u.p, max(u.s) AS s
                  FROM (SELECT o.p, o.s FROM unnest(b.latest_participants, b.latest_stamps) AS o(p, s)
                        UNION ALL
                        SELECT n.p, ('x' || substr(n.a, 1, 16))::bit(64)::bigint
                          FROM unnest(b.members, b.member_ids) AS n(p, a)) u
                 GROUP BY u.p) l
         WHERE l.s + 30000000 >= (SELECT max(('x' || substr(a, 1, 16))::bit(64)::bigint)
                                    FROM unnest(b.member_ids) AS z(a));
        UPDATE @s@.barriers x
           SET generation = @s@.fencing_next(), members = '{}', member_ids = '{}',
               withdrawn_ids = '{}',
               passed = b.members, passed_ids = b.member_ids,
               passed_generation = b.generation, parties = p_parties,
               latest_participants = b.latest_participants, latest_stamps = b.latest_stamps,
               updated_at = clock_timestamp()
         WHERE x.name = p_name;
        PERFORM pg_notify(p_channel, 'barrier:' || p_name);
        complete := true;
    ELSE
        UPDATE @s@.barriers x SET members = b.members, member_ids = b.member_ids,
               parties = p_parties, updated_at = clock_timestamp()
         WHERE x.name = p_name;
    END IF;
END
$fn$;

-- Withdraw one arrival (p_arrival, of p_participant) from a generation
-- unless it has completed, decided on the row locked FOR UPDATE (the
-- newest version, after any completing arrival that held the lock has
-- committed). Only that arrival goes: the participant stays while another
-- of its arrivals (a next wait) is in. The id is kept as a tombstone until
-- the open generation completes, so a late copy of it is refused; its
-- stamp joins the participant's newest (`latest_stamps`, as a passed
-- arrival's does), so a copy landing after that is refused too. A
-- generation below `born` belongs to a row the sweep deleted (its
-- arrivals went with it): nothing to withdraw, never "passed". A missing
-- row is made again to hold the tombstone. True: the arrival no longer
-- counts; false: the generation completed, the participant passed.
CREATE OR REPLACE FUNCTION @s@.barrier_withdraw(
    p_name text, p_generation bigint, p_participant text, p_arrival text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    b @s@.barriers%ROWTYPE;
    v_stamp bigint := ('x' || substr(p_arrival, 1, 16))::bit(64)::bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    LOOP
        INSERT INTO @s@.barriers AS x (name, parties, generation, born, updated_at)
        SELECT p_name, 0, g.v, g.v, clock_timestamp()
          FROM (SELECT @s@.fencing_next() AS v
                 WHERE NOT EXISTS (SELECT 1 FROM @s@.barriers y WHERE y.name = p_name)) g
        ON CONFLICT (name) DO NOTHING;
        SELECT * INTO b FROM @s@.barriers x WHERE x.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    IF p_generation >= b.born AND b.generation > p_generation THEN
        RETURN false;
    END IF;
    -- Remove the arrival and its member entry (same position).
    UPDATE @s@.barriers x
       SET members = (SELECT coalesce(array_agg(m ORDER BY i), '{}')
                        FROM unnest(b.members, b.member_ids) WITH ORDINALITY AS u(m, a, i)
                       WHERE NOT (m = p_participant AND a = p_arrival)),
           member_ids = (SELECT coalesce(array_agg(a ORDER BY i), '{}')
                           FROM unnest(b.members, b.member_ids) WITH ORDINALITY AS u(m, a, i)
                          WHERE NOT (m = p_participant AND a = p_arrival)),
           withdrawn_ids = CASE WHEN p_arrival = ANY (b.withdrawn_ids) THEN b.withdrawn_ids
                                ELSE array_append(b.withdrawn_ids, p_arrival) END,
           latest_participants = CASE WHEN p_participant = ANY (b.latest_participants)
                                      THEN b.latest_participants
                                      ELSE array_append(b.latest_participants, p_participant) END,
           latest_stamps = CASE WHEN p_participant = ANY (b.latest_participants)
                                THEN (SELECT array_agg(CASE WHEN l.p = p_participant
                                                            THEN greatest(l.s, v_stamp) ELSE l.s END
                                                       ORDER BY l.i)
                                        FROM unnest(b.latest_participants, b.latest_stamps)
                                             WITH ORDINALITY AS l(p, s, i))
                                ELSE array_append(b.latest_stamps, v_stamp) END,
           updated_at = clock_timestamp()
     WHERE x.name = p_name;
    RETURN true;
END
$fn$;
