-- Barriers (`@s@` is the quoted schema name). One row per barrier, locked
-- FOR UPDATE by every change, so each decision is made on the newest row.
-- p_arrival identifies one wait (the same on its retries): an arrival id of
-- the generation that completed last returns that generation as complete
-- and changes nothing, so a retried completing arrival never joins the
-- next generation.
CREATE OR REPLACE FUNCTION @s@.barrier_arrive(
    p_name text, p_parties integer, p_participant text, p_channel text, p_arrival text,
    OUT generation bigint, OUT complete boolean, OUT started_with integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    b @s@.barriers%ROWTYPE;
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
    -- An open generation with nobody in it that was drawn on an earlier
    -- timeline (this server is a promoted standby) may have completed on
    -- the old primary in WAL this one never got: it gets a number of this
    -- timeline, so no generation is reported twice. Nobody waits on it,
    -- and a wait on an older generation still finds it complete (layout 10).
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
    IF p_participant = ANY (b.members) THEN
        RETURN;
    END IF;
    b.members := array_append(b.members, p_participant);
    b.member_ids := array_append(b.member_ids, p_arrival);
    IF cardinality(b.members) >= p_parties THEN
        UPDATE @s@.barriers x
           SET generation = @s@.fencing_next(), members = '{}', member_ids = '{}',
               passed = b.members, passed_ids = b.member_ids,
               passed_generation = b.generation, parties = p_parties,
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

-- Withdraw a participant from a generation unless it has completed,
-- decided on the row locked FOR UPDATE (the newest version, after any
-- completing arrival that held the lock has committed). True: withdrawn
-- (or not there); false: the generation completed, the participant passed.
CREATE OR REPLACE FUNCTION @s@.barrier_withdraw(
    p_name text, p_generation bigint, p_participant text)
RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    b @s@.barriers%ROWTYPE;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    SELECT * INTO b FROM @s@.barriers x WHERE x.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    IF b.generation > p_generation THEN
        RETURN false;
    END IF;
    IF b.generation = p_generation AND p_participant = ANY (b.members) THEN
        -- Remove the member and its arrival id (same position).
        UPDATE @s@.barriers x
           SET members = (SELECT coalesce(array_agg(m ORDER BY i), '{}')
                            FROM unnest(b.members, b.member_ids) WITH ORDINALITY AS u(m, a, i)
                           WHERE m <> p_participant),
               member_ids = (SELECT coalesce(array_agg(a ORDER BY i), '{}')
                               FROM unnest(b.members, b.member_ids) WITH ORDINALITY AS u(m, a, i)
                              WHERE m <> p_participant),
               updated_at = clock_timestamp()
         WHERE x.name = p_name;
    END IF;
    RETURN true;
END
$fn$;
