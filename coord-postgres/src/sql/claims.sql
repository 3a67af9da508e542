-- Lock, lease and election attempts (`@s@` is the quoted schema,
-- `@schema@` its bare name). A name
-- nobody holds has no row (release deletes it), so the common attempt is
-- the plain INSERT `claim_insert` (src/sql.rs), which draws the fencing
-- token only when the row is absent from its snapshot; when it finds a
-- row, the client calls claim_acquire (and waiters and elections call it
-- directly).
--
-- Fencing across deleted rows: a token drawn before the row is in the
-- index could be overtaken (another client inserts, is granted a higher
-- token, releases and deletes, all before this insert lands). So every
-- grant takes the name's grant lock, a transaction-scoped advisory lock
-- on (hashtext('coord-claims:<schema>'), hashtext(kind:name)), BEFORE it
-- draws its token, and keeps it until its commit: the draws of one name
-- are serialized in grant order. Refused attempts and releases never take
-- it. It lives in the two-key advisory space; the keys are namespaced but
-- an application's own two-key advisory locks could collide with them
-- (that only makes a grant wait).
--
-- claim_acquire reads the row plainly (no lock): when it is live and held
-- by another, the attempt takes no row lock, no transaction id and writes
-- nothing (it never queues behind, or in front of, the holder's extend),
-- and returns the holder's remaining time on the database clock. Only a
-- row that looked absent, free, expired or ours is upserted: taken if it
-- still is (re-checked on the newest version under the row lock, on the
-- clock read then); a fresh grant gets a new fencing token from the
-- sequence drawn AFTER the row is locked (in DO UPDATE); a repeat by the
-- same live owner keeps its token.
--
-- Wake-ups: a refused attempt of a client with waiters on the name
-- (p_wait) marks the holder's row `waiting` (the one write a refused
-- attempt may make, once per grant), so the holder's release sends NOTIFY;
-- a release nobody waits for sends none (each NOTIFY takes a database-wide
-- lock at commit, serializing every notifying commit and its WAL flush).
-- `registered` says the mark is there; when it is not (the holder's row
-- changed or went since the read), the caller retries at once. Marking and
-- release both lock the row, so either the release sees the mark and
-- notifies, or the mark finds the row gone and the waiter retries: no
-- wake-up is lost. A grant keeps the mark (and sets it when its client has
-- other waiters), so the next release wakes the rest.
--
-- p_notify: send NOTIFY when this starts a new grant (elections: observers
-- learn of each new term). Neither granted nor held_us: the row changed
-- under the attempt (taken or freed by another meanwhile); retry at once.
--
-- p_metadata (layout 9): stored with a new grant (NULL: none, which also
-- clears an expired holder's); a repeat by the same live owner keeps the
-- grant's metadata as it is.
CREATE OR REPLACE FUNCTION @s@.claim_acquire(
    p_kind text, p_name text, p_owner bytea, p_candidate text, p_ttl_us bigint,
    p_channel text, p_notify boolean, p_wait boolean, p_metadata bytea,
    OUT granted bigint, OUT held_us bigint, OUT registered boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    o record;
    t timestamptz;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    registered := false;
    t := clock_timestamp();
    SELECT c.fencing, c.owner, c.expires_at, c.waiting INTO o FROM @s@.claims c
     WHERE c.kind = p_kind AND c.name = p_name;
    IF FOUND AND o.owner IS NOT NULL AND o.owner <> p_owner AND o.expires_at > t THEN
        held_us := (extract(epoch FROM (o.expires_at - t)) * 1000000)::int8;
        registered := o.waiting;
        IF p_wait AND NOT o.waiting THEN
            UPDATE @s@.claims c SET waiting = true
             WHERE c.kind = p_kind AND c.name = p_name AND c.owner = o.owner;
            registered := FOUND;
        END IF;
        RETURN;
    END IF;
    -- The grant lock of the name, then the token (see above).
    PERFORM pg_advisory_xact_lock(hashtext('coord-claims:@schema@'), hashtext(p_kind || ':' || p_name));
    INSERT INTO @s@.claims AS c (kind, name, owner, candidate, fencing, expires_at, waiting, metadata)
    VALUES (p_kind, p_name, p_owner, p_candidate, @s@.fencing_next(),
            clock_timestamp() + p_ttl_us * interval '1 microsecond', p_wait, p_metadata)
    ON CONFLICT (kind, name) DO UPDATE
      SET owner = EXCLUDED.owner, candidate = EXCLUDED.candidate,
          fencing = CASE WHEN c.owner = EXCLUDED.owner AND c.expires_at > clock_timestamp()
                         THEN c.fencing ELSE @s@.fencing_next() END,
          metadata = CASE WHEN c.owner = EXCLUDED.owner AND c.expires_at > clock_timestamp()
                          THEN c.metadata ELSE EXCLUDED.metadata END,
          expires_at = clock_timestamp() + p_ttl_us * interval '1 microsecond',
          waiting = c.waiting OR EXCLUDED.waiting
      WHERE c.owner IS NULL OR c.owner = EXCLUDED.owner OR c.expires_at <= clock_timestamp()
    RETURNING c.fencing INTO granted;
    IF p_notify AND granted IS NOT NULL AND granted IS DISTINCT FROM o.fencing THEN
        PERFORM pg_notify(p_channel, p_kind || ':' || p_name);
    END IF;
END
$fn$;

-- The layout-8 signature, for clients of that layout still running while
-- a schema is upgraded (they accept any later layout): the same attempt
-- without metadata, so a grant they make never keeps an earlier holder's.
CREATE OR REPLACE FUNCTION @s@.claim_acquire(
    p_kind text, p_name text, p_owner bytea, p_candidate text, p_ttl_us bigint,
    p_channel text, p_notify boolean, p_wait boolean,
    OUT granted bigint, OUT held_us bigint, OUT registered boolean)
LANGUAGE sql AS $fn$
    SELECT a.granted, a.held_us, a.registered
      FROM @s@.claim_acquire(p_kind, p_name, p_owner, p_candidate, p_ttl_us,
                             p_channel, p_notify, p_wait, NULL::bytea) a
$fn$;
