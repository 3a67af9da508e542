-- Lock, lease and election attempts (`@s@` is the quoted schema,
-- `@schema@` its bare name).
--
-- Rows stay: a name has one row from its first grant until the
-- sweep deletes it. Release sets owner NULL in place (metadata and
-- candidate go with it; fencing, expires_at and waiting stay), so the
-- common attempt is one call of `claim_take` below: an UPDATE of the
-- name's row in place when it is free or expired (a HOT update: no index
-- entry, no new row), else, when the name has no row, claim_insert. When
-- it returns no token, the client calls claim_acquire (and waiters and
-- elections call it directly). The
-- sweep deletes a row whose last grant ended more than its grace ago
-- (expires_at < now - grace, free or not): an idle name costs nothing.
--
-- Fencing: every token is drawn AFTER the row it is stored in is in the
-- unique index, by an UPDATE of that row. An UPDATE evaluates its new
-- values on the newest version of the row, under the row lock (a version
-- changed since the snapshot is re-read, re-checked and re-drawn): every
-- earlier grant of the name made a version this one replaces, committed
-- before this statement's snapshot, so its token was drawn before this
-- one. A new name's row is inserted first as a free placeholder and taken
-- by an UPDATE in the same transaction (claim_insert): no grant can come
-- between (the placeholder's index entry makes any other insert wait for
-- this commit), and every grant of a row the sweep deleted before was
-- drawn before that deletion. So no token is drawn before its row is in
-- the index.
--
-- claim_acquire reads the row plainly (no lock): when it is live and held
-- by another, the attempt takes no row lock, no transaction id and writes
-- nothing (it never queues behind, or in front of, the holder's extend),
-- and returns the holder's remaining time on the database clock. Only a
-- row that looked absent, free, expired or ours is taken: a new name's
-- placeholder inserted (ON CONFLICT DO NOTHING: another's insert won),
-- then the row updated if it still is free, expired or ours (re-checked
-- on the newest version under the row lock, on the clock read then); a
-- fresh grant gets a new fencing token drawn in that UPDATE; a repeat by
-- the same live owner keeps its token.
--
-- Wake-ups: a refused attempt of a client with waiters on the name
-- (p_wait) marks the holder's row `waiting` (the one write a refused
-- attempt may make, once per grant), so the holder's release sends NOTIFY;
-- a release nobody waits for sends none (each NOTIFY takes a database-wide
-- lock at commit, serializing every notifying commit and its WAL flush).
-- `registered` says the mark is there; when it is not (the holder's row
-- changed or went since the read), the caller retries at once. Marking and
-- release both lock the row, so either the release sees the mark and
-- notifies, or the mark finds the row changed and the waiter retries: no
-- wake-up is lost. A release leaves the mark on the free row; a grant of a
-- free row clears it (its waiters were woken) and sets it when its client
-- has other waiters; a takeover of an expired row keeps it (nobody
-- released, so nobody was woken), so the next release wakes the rest.
--
-- p_notify: send NOTIFY when this starts a new grant (elections: observers
-- learn of each new term). Neither granted nor held_us: the row changed
-- under the attempt (taken or freed by another meanwhile); retry at once.
--
-- p_metadata: stored with a new grant (NULL: none, which also clears an
-- expired holder's); a repeat by the same live owner keeps the grant's
-- metadata as it is.
--
-- Late attempts (`coord_core::late`): an attempt its client
-- gave up on (its call timed out on a slow network) may still land after
-- the acquire ended and its owner released, and would then take the name
-- for nobody until its TTL. Every attempt carries its client's stamp
-- (p_stamp, rising within a process); the release of an owner one of
-- whose attempts went unanswered goes through claim_leave, which also
-- marks the owner as left at the release's stamp on the name's row
-- (creating a free row if there is none) for p_ttl_us. An attempt of that
-- owner stamped before the mark takes nothing (claim_is_left). The mark
-- is on the row itself, so the race of a late attempt with the release
-- that marks it is decided by the row lock: an attempt that locked the
-- row first is a grant the release then frees; one that waited for the
-- release's lock re-reads the newest row, mark included, and takes
-- nothing. Marks are pruned by the next claim_leave on the name once
-- lapsed; the sweep keeps a row while a mark on it holds. An attempt
-- without a stamp (NULL) is never refused.
CREATE OR REPLACE FUNCTION @s@.claim_is_left(
    p_owners bytea[], p_stamps bigint[], p_until timestamptz[], p_owner bytea, p_stamp bigint)
RETURNS boolean
LANGUAGE sql AS $fn$
    SELECT EXISTS (SELECT 1 FROM unnest(p_owners, p_stamps, p_until) AS l(o, s, u)
                    WHERE l.o = p_owner AND l.s > p_stamp AND l.u > clock_timestamp())
$fn$;

CREATE OR REPLACE FUNCTION @s@.claim_acquire(
    p_kind text, p_name text, p_owner bytea, p_candidate text, p_ttl_us bigint,
    p_channel text, p_notify boolean, p_wait boolean, p_metadata bytea, p_stamp bigint,
    OUT granted bigint, OUT held_us bigint, OUT registered boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    o record;
    t timestamptz;
    present boolean;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    registered := false;
    t := clock_timestamp();
    SELECT c.fencing, c.owner, c.expires_at, c.waiting INTO o FROM @s@.claims c
     WHERE c.kind = p_kind AND c.name = p_name;
    present := FOUND;
    IF present AND o.owner IS NOT NULL AND o.owner <> p_owner AND o.expires_at > t THEN
        held_us := (extract(epoch FROM (o.expires_at - t)) * 1000000)::int8;
        registered := o.waiting;
        IF p_wait AND NOT o.waiting THEN
            UPDATE @s@.claims c SET waiting = true
             WHERE c.kind = p_kind AND c.name = p_name AND c.owner = o.owner;
            registered := FOUND;
        END IF;
        RETURN;
    END IF;
    -- The name's grant lock: this function's grants of a name one at a time
    -- (fencing does not rest on it: see above).
    PERFORM pg_advisory_xact_lock(hashtext('coord-claims:@schema@'), hashtext(p_kind || ':' || p_name));
    IF NOT present THEN
        INSERT INTO @s@.claims (kind, name, owner, fencing, expires_at)
        VALUES (p_kind, p_name, NULL, 0, clock_timestamp())
        ON CONFLICT (kind, name) DO NOTHING;
    END IF;
    UPDATE @s@.claims c
       SET owner = p_owner, candidate = p_candidate,
           fencing = CASE WHEN c.owner = p_owner AND c.expires_at > clock_timestamp()
                          THEN c.fencing ELSE @s@.fencing_next() END,
           metadata = CASE WHEN c.owner = p_owner AND c.expires_at > clock_timestamp()
                           THEN c.metadata ELSE p_metadata END,
           expires_at = clock_timestamp() + p_ttl_us * interval '1 microsecond',
           waiting = (c.owner IS NOT NULL AND c.waiting) OR p_wait
     WHERE c.kind = p_kind AND c.name = p_name
       AND (c.owner IS NULL OR c.owner = p_owner OR c.expires_at <= clock_timestamp())
       AND (c.left_owners IS NULL
            OR NOT @s@.claim_is_left(c.left_owners, c.left_stamps, c.left_until, p_owner, p_stamp))
    RETURNING c.fencing INTO granted;
    IF p_notify AND granted IS NOT NULL AND granted IS DISTINCT FROM o.fencing THEN
        PERFORM pg_notify(p_channel, p_kind || ':' || p_name);
    END IF;
END
$fn$;

-- A new name's grant, called by `claim_take` when the name has no row:
-- the row is inserted as a free placeholder (no token), then taken in
-- place by `claim_take`, so the token is drawn once the row is in the
-- index (see above). NULL when another's insert came first and its grant
-- is live, or a mark says p_owner left since p_stamp (the caller then
-- calls claim_acquire).
CREATE OR REPLACE FUNCTION @s@.claim_insert(
    p_kind text, p_name text, p_owner bytea, p_candidate text, p_ttl_us bigint,
    p_metadata bytea, p_stamp bigint)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
BEGIN
    INSERT INTO @s@.claims (kind, name, owner, fencing, expires_at)
    VALUES (p_kind, p_name, NULL, 0, clock_timestamp())
    ON CONFLICT (kind, name) DO NOTHING;
    RETURN @s@.claim_take(p_kind, p_name, p_owner, p_candidate, p_ttl_us, p_metadata, p_stamp);
END
$fn$;

-- The common attempt (one function call: as one statement, a CTE with
-- both branches, its executor set-up was about a fifth of the backend's
-- instructions per lock cycle): the row taken in
-- place when it is free or expired, the token drawn under the row lock;
-- only when that finds nothing and the name has no row, claim_insert. A
-- name held by another (or whose row appeared since the UPDATE's
-- snapshot) gets NULL, and the client calls claim_acquire. Nothing is
-- written (no row lock, no transaction id) when the row is held. Like
-- claim_acquire, it refuses another isolation level than read committed
-- before it writes. p_metadata: the grant's metadata (NULL: none).
CREATE OR REPLACE FUNCTION @s@.claim_take(
    p_kind text, p_name text, p_owner bytea, p_candidate text, p_ttl_us bigint,
    p_metadata bytea, p_stamp bigint)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    granted bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    UPDATE @s@.claims c
       SET owner = p_owner, candidate = p_candidate, fencing = @s@.fencing_next(),
           metadata = p_metadata,
           expires_at = clock_timestamp() + p_ttl_us * interval '1 microsecond',
           waiting = c.owner IS NOT NULL AND c.waiting
     WHERE c.kind = p_kind AND c.name = p_name
       AND (c.owner IS NULL OR c.expires_at <= clock_timestamp())
       AND (c.left_owners IS NULL
            OR NOT @s@.claim_is_left(c.left_owners, c.left_stamps, c.left_until, p_owner, p_stamp))
    RETURNING c.fencing INTO granted;
    IF FOUND THEN
        RETURN granted;
    END IF;
    -- No row: claim_insert inserts one and calls this again, which takes
    -- it (or, if its insert met a row the sweep deleted since, comes back
    -- here to insert again).
    IF EXISTS (SELECT 1 FROM @s@.claims x WHERE x.kind = p_kind AND x.name = p_name) THEN
        RETURN NULL;
    END IF;
    RETURN @s@.claim_insert(p_kind, p_name, p_owner, p_candidate, p_ttl_us, p_metadata, p_stamp);
END
$fn$;

-- The release of an owner one of whose attempts went unanswered (see
-- "Late attempts"): as the `claim_release` statement (the owner's row,
-- live or expired, is freed in place; `held` says it was live; NOTIFY
-- when p_notify or a waiter marked it), and in the same step the owner is
-- marked as left at p_stamp for p_ttl_us on the name's row, whoever holds
-- it (a free row is inserted when the name has none: the late attempt may
-- not have landed yet). Lapsed marks are pruned here.
CREATE OR REPLACE FUNCTION @s@.claim_leave(
    p_kind text, p_name text, p_owner bytea, p_channel text, p_notify boolean,
    p_stamp bigint, p_ttl_us bigint, OUT held boolean, OUT woke boolean)
LANGUAGE plpgsql AS $fn$
DECLARE
    o record;
    t timestamptz;
    mine boolean;
    n_owners bytea[];
    n_stamps bigint[];
    n_until timestamptz[];
    s bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM @s@.not_read_committed();
    END IF;
    LOOP
        SELECT c.owner, c.expires_at, c.waiting, c.left_owners, c.left_stamps, c.left_until
          INTO o FROM @s@.claims c
         WHERE c.kind = p_kind AND c.name = p_name FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO @s@.claims (kind, name, owner, fencing, expires_at)
        VALUES (p_kind, p_name, NULL, 0, clock_timestamp())
        ON CONFLICT (kind, name) DO NOTHING;
    END LOOP;
    -- The clock once the row is locked (as the release statement reads it).
    t := clock_timestamp();
    mine := o.owner IS NOT NULL AND o.owner = p_owner;
    held := mine AND o.expires_at > t;
    -- The marks that still hold, but p_owner's (kept at its highest stamp).
    SELECT array_agg(l.o) FILTER (WHERE l.o <> p_owner),
           array_agg(l.s) FILTER (WHERE l.o <> p_owner),
           array_agg(l.u) FILTER (WHERE l.o <> p_owner),
           max(l.s) FILTER (WHERE l.o = p_owner)
      INTO n_owners, n_stamps, n_until, s
      FROM unnest(o.left_owners, o.left_stamps, o.left_until) AS l(o, s, u)
     WHERE l.u > t;
    s := greatest(s, p_stamp);
    UPDATE @s@.claims c
       SET owner = CASE WHEN mine THEN NULL ELSE c.owner END,
           candidate = CASE WHEN mine THEN NULL ELSE c.candidate END,
           metadata = CASE WHEN mine THEN NULL ELSE c.metadata END,
           left_owners = n_owners || p_owner,
           left_stamps = n_stamps || s,
           left_until = n_until || (t + p_ttl_us * interval '1 microsecond')
     WHERE c.kind = p_kind AND c.name = p_name;
    woke := mine AND (p_notify OR o.waiting);
    IF woke THEN
        PERFORM pg_notify(p_channel, p_kind || ':' || p_name);
    END IF;
END
$fn$;

