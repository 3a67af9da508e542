-- Barriers (`@s@` is the quoted schema name). One row per barrier, locked
-- FOR UPDATE by every change, so each decision is made on the newest row.
CREATE OR REPLACE FUNCTION @s@.barrier_arrive(
    p_name text, p_parties integer, p_participant text, p_channel text,
    OUT generation bigint, OUT complete boolean, OUT started_with integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    b @s@.barriers%ROWTYPE;
BEGIN
    INSERT INTO @s@.barriers AS x (name, parties, generation)
    VALUES (p_name, p_parties, 1) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO b FROM @s@.barriers x WHERE x.name = p_name FOR UPDATE;
    generation := b.generation;
    complete := false;
    IF cardinality(b.members) > 0 AND b.parties <> p_parties THEN
        started_with := b.parties;
        RETURN;
    END IF;
    started_with := p_parties;
    IF p_participant = ANY (b.members) THEN
        RETURN;
    END IF;
    b.members := array_append(b.members, p_participant);
    IF cardinality(b.members) >= p_parties THEN
        UPDATE @s@.barriers x
           SET generation = b.generation + 1, members = '{}', passed = b.members, parties = p_parties
         WHERE x.name = p_name;
        PERFORM pg_notify(p_channel, 'barrier:' || p_name);
        complete := true;
    ELSE
        UPDATE @s@.barriers x SET members = b.members, parties = p_parties WHERE x.name = p_name;
    END IF;
END
$fn$;
