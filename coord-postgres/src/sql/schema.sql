-- The layout of one schema (`@s@` is the quoted schema name), created in
-- one transaction under a transaction-scoped advisory lock (taken by the
-- caller) so that clients starting together never race on IF NOT EXISTS.
CREATE SCHEMA IF NOT EXISTS @s@;
CREATE TABLE IF NOT EXISTS @s@.meta (
    id integer PRIMARY KEY CHECK (id = 1),
    version integer NOT NULL
);
-- One counter for every fencing token this schema hands out: lock grants,
-- lease grants, election terms and FencingSource::next. Sequences are
-- WAL-logged, so tokens keep rising across restarts and crashes.
CREATE SEQUENCE IF NOT EXISTS @s@.fencing AS bigint;
-- Locks, leases and leaderships: one row per (kind, name) in use. Release
-- frees the row in place (owner NULL)
-- and the next grant takes it in place; the sweep deletes a row whose last
-- grant expired more than the grace ago, released or not. Deleting is
-- safe for fencing: every grant draws its token from the sequence in its
-- own transaction, once its row is in the index (src/sql/claims.sql), so
-- a name used again gets a higher token than every earlier grant.
CREATE TABLE IF NOT EXISTS @s@.claims (
    kind text NOT NULL,
    name text NOT NULL,
    owner bytea,
    candidate text,
    fencing bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    -- A client waits for this grant to end (its refused attempt said so),
    -- so its release sends NOTIFY; a release nobody waits for sends none.
    waiting boolean NOT NULL DEFAULT false,
    -- Holder metadata: the JSON value the grant was made with (at most
    -- 1 KiB, checked by the client), NULL when none. Only the statement
    -- that makes a new grant writes it (a retry by the live owner keeps
    -- the grant as it is, metadata included; a takeover of an expired row
    -- replaces it), and it goes with the grant at release, force release
    -- or the sweep: it never outlives its grant.
    metadata bytea,
    -- Owners that left while one of their claim attempts was unanswered
    -- (see src/sql/claims.sql, "Late attempts"): three arrays of the same
    -- length, one element per owner: the owner, its client's stamp of the
    -- release, and until when the mark holds. NULL (nearly always) when
    -- no owner left so. On the name's row itself, not in a table of their
    -- own, so that an attempt that waited for the row lock of the release
    -- that marked it re-reads the mark with the row (a table read would
    -- still see its statement's snapshot, from before the mark).
    left_owners bytea[],
    left_stamps bigint[],
    left_until timestamptz[],
    PRIMARY KEY (kind, name)
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS @s@.barriers (
    name text PRIMARY KEY,
    parties integer NOT NULL,
    generation bigint NOT NULL,
    members text[] NOT NULL DEFAULT '{}',
    passed text[] NOT NULL DEFAULT '{}',
    -- Each participant's newest arrival stamp (see barrier_arrive).
    latest_participants text[] NOT NULL DEFAULT '{}',
    latest_stamps bigint[] NOT NULL DEFAULT '{}',
    -- The arrival id of each member (same order as members).
    member_ids text[] NOT NULL DEFAULT '{}',
    -- The arrival ids of the generation that completed last, and that
    -- generation, so a retried completing arrival is recognised.
    passed_ids text[] NOT NULL DEFAULT '{}',
    passed_generation bigint,
    -- The last arrival or withdrawal, for the sweep.
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- The generation the row was created with. Generations are drawn from
    -- the fencing sequence, so a barrier whose row was swept and made
    -- again never repeats a generation, and a generation older than
    -- `born` is unknown rather than complete.
    born bigint NOT NULL DEFAULT 0,
    -- The arrival ids withdrawn from the open generation (tombstones), so
    -- a late copy of a withdrawn arrival is refused; cleared when the
    -- generation completes.
    withdrawn_ids text[] NOT NULL DEFAULT '{}'
);
-- One row per (algorithm, key). Times in microseconds since the Unix epoch
-- on the database clock. q_limit / q_window: the quota the state was last
-- written under (NULL: no state yet). window_start: start of the current (fixed or sliding) window;
-- cur / prev: its count and the previous window's; retain: the sliding
-- log's retention window; tat_x: GCRA's theoretical arrival time times
-- q_limit, exact.
CREATE TABLE IF NOT EXISTS @s@.limiter_state (
    algorithm text NOT NULL,
    key text NOT NULL,
    window_start bigint NOT NULL DEFAULT 0,
    cur bigint NOT NULL DEFAULT 0,
    prev bigint NOT NULL DEFAULT 0,
    tat double precision NOT NULL DEFAULT 0,
    q_limit bigint,
    q_window bigint,
    retain bigint,
    tat_x numeric,
    PRIMARY KEY (algorithm, key)
);
CREATE TABLE IF NOT EXISTS @s@.limiter_log (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    at bigint NOT NULL,
    cost bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS limiter_log_key_at ON @s@.limiter_log (key, at);
-- Semaphores (see src/sql/semaphore.sql): one row per live
-- grant and one per queued waiter, no row per name. total: the name's
-- permits_total, the same on every live row of a name. place: the
-- waiter's place in line (from semaphore_places); wake: its client
-- LISTENs, so a release that makes it grantable sends NOTIFY. Released
-- grants and places are deleted at once; expired ones are pruned by the
-- next write on the name or deleted by the sweep after the grace.
CREATE TABLE IF NOT EXISTS @s@.semaphore_holders (
    name text NOT NULL,
    owner bytea NOT NULL,
    permits integer NOT NULL,
    total integer NOT NULL,
    fencing bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    -- Holder metadata, as on claims.
    metadata bytea,
    PRIMARY KEY (name, owner)
);
CREATE TABLE IF NOT EXISTS @s@.semaphore_queue (
    name text NOT NULL,
    owner bytea NOT NULL,
    permits integer NOT NULL,
    total integer NOT NULL,
    place bigint NOT NULL,
    wake boolean NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, owner)
);
CREATE INDEX IF NOT EXISTS semaphore_queue_place ON @s@.semaphore_queue (name, place);
CREATE SEQUENCE IF NOT EXISTS @s@.semaphore_places AS bigint;
-- Owners that left while one of their attempts was unanswered (see
-- src/sql/semaphore.sql): the release of such an owner records its
-- client's stamp of the release, so that attempt, landing after the
-- release, changes nothing. A row lasts the left TTL (SEMAPHORE_LEFT_TTL);
-- lapsed ones are pruned by the next write on the name or deleted by the
-- sweep after the grace.
CREATE TABLE IF NOT EXISTS @s@.semaphore_left (
    name text NOT NULL,
    owner bytea NOT NULL,
    stamp bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (name, owner)
);
-- Isolation. Every step decides on rows it reads after taking
-- the name's lock, which only READ COMMITTED shows (each statement takes
-- a fresh snapshot). At REPEATABLE READ or SERIALIZABLE the snapshot is
-- the transaction's, taken before the lock was granted: a step that waited
-- for the lock would decide on rows the previous holder has since changed
-- (a semaphore would grant the same permit again) or fail with
-- serialization errors. The client pins read committed on every
-- transaction it starts (and, with prepared statements, on the session of
-- every connection it opens); each step still checks, first, and refuses
-- to read or write anything at another level with SQLSTATE RC001, which
-- the client reports as a configuration error naming the fix.
CREATE OR REPLACE FUNCTION @s@.not_read_committed()
RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'RC001',
        MESSAGE = format('coord: this transaction runs at %s isolation, but coord''s steps '
                         'must run at read committed; nothing was changed',
                         current_setting('transaction_isolation'));
END
$fn$;
-- Work queues (see src/sql/queue.sql). queue_messages: one row
-- per message of a lane (0 main, 1 dead); due_at NULL: ready, else
-- delayed until it (owner NULL) or in flight to owner until it; turn: its
-- place across groups (NULL for a message pushed with a delay, until it
-- is first ready); step: the stamp of the last extend applied for owner
-- (NULL without). queue_groups: one row per group with messages in a
-- lane, with the highest turn given to its messages there; queue_dedup:
-- dedup ids until they expire. Message ids come from queue_ids;
-- queue_flush is only ever set, to make a step durable. The indexes are
-- shaped so that each statement has one index that fits (a look-up by id
-- only the primary key, a group's messages only the (queue, grp, ...)
-- one), so plans made before the planner has statistics are already the
-- right ones.
CREATE TABLE IF NOT EXISTS @s@.queue_messages (
    queue text NOT NULL,
    lane smallint NOT NULL,
    id bigint NOT NULL,
    grp text NOT NULL,
    attempts integer NOT NULL,
    enqueued_at timestamptz NOT NULL,
    due_at timestamptz,
    owner bytea,
    turn bigint,
    step bigint,
    payload bytea NOT NULL,
    PRIMARY KEY (queue, lane, id)
);
CREATE INDEX IF NOT EXISTS queue_messages_group ON @s@.queue_messages (queue, grp, lane, id);
CREATE INDEX IF NOT EXISTS queue_messages_ready ON @s@.queue_messages (queue, lane, turn, id)
    WHERE due_at IS NULL;
CREATE INDEX IF NOT EXISTS queue_messages_due ON @s@.queue_messages (queue, lane, due_at)
    WHERE due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS queue_messages_owner ON @s@.queue_messages (owner)
    WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS @s@.queue_groups (
    queue text NOT NULL,
    lane smallint NOT NULL,
    grp text NOT NULL,
    last bigint NOT NULL,
    PRIMARY KEY (queue, grp, lane)
);
CREATE INDEX IF NOT EXISTS queue_groups_last ON @s@.queue_groups (queue, lane, last);
CREATE TABLE IF NOT EXISTS @s@.queue_dedup (
    queue text NOT NULL,
    dedup_id text NOT NULL,
    id bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue, dedup_id)
);
CREATE INDEX IF NOT EXISTS queue_dedup_expires ON @s@.queue_dedup (expires_at);
-- queue_abandoned: consumers whose pop attempts no caller saw the outcome
-- of, until when: an attempt of one that lands meanwhile delivers nothing.
CREATE TABLE IF NOT EXISTS @s@.queue_abandoned (
    queue text NOT NULL,
    owner bytea NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (queue, owner)
);
CREATE INDEX IF NOT EXISTS queue_abandoned_until ON @s@.queue_abandoned (until);
-- queue_waiting: until when somebody waits on a queue's lane (a pop from
-- a client with a waiter there leaves it): the steps that can make a
-- message deliverable notify only while it is live.
CREATE TABLE IF NOT EXISTS @s@.queue_waiting (
    queue text NOT NULL,
    lane smallint NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (queue, lane)
);
CREATE INDEX IF NOT EXISTS queue_waiting_until ON @s@.queue_waiting (until);
CREATE SEQUENCE IF NOT EXISTS @s@.queue_ids AS bigint;
CREATE SEQUENCE IF NOT EXISTS @s@.queue_flush AS bigint;
-- Fencing tokens across a failover. Every token, term and
-- barrier generation comes from `fencing_next()`, never from the sequence
-- directly. A standby fed by asynchronous streaming replication may miss
-- the newest WAL of its primary, the sequence's included: once promoted,
-- `nextval` alone would hand out again tokens the old primary issued in
-- the tail the standby never got. A promotion starts a new timeline (as
-- does the end of a point-in-time recovery), so each timeline gets a range
-- of its own above every earlier one: tokens of timeline T are above
-- T * 2^48. The first draw on a timeline moves the sequence up to its
-- range, under a transaction-scoped advisory lock, checked again once
-- held; later draws are a plain `nextval` and a look at the timeline. The
-- sequence only ever moves up.
CREATE OR REPLACE FUNCTION @s@.fencing_floor()
RETURNS bigint
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    -- The first 8 hex digits of a WAL file name are its timeline; this
    -- one is the file being written now (an error on a standby, which
    -- cannot write anyway).
    tli bigint := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
BEGIN
    IF tli >= 32768 THEN
        RAISE EXCEPTION 'coord: timeline % is past the 32767 that fencing tokens have room for', tli;
    END IF;
    RETURN tli << 48;
END
$fn$;
-- The draw of `timeline_next` whose value was not in this timeline's
-- range (before, the body of `timeline_next` itself): draw
-- again, and if still below the range, move the sequence up, once. A
-- second drawer that got a low value waits here and then draws above it.
CREATE OR REPLACE FUNCTION @s@.timeline_move(p_seq regclass, p_key integer)
RETURNS bigint
LANGUAGE plpgsql AS $fn$
DECLARE
    v bigint := nextval(p_seq);
    lowest bigint := @s@.fencing_floor();
BEGIN
    IF v > lowest THEN
        RETURN v;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('coord-fencing:@schema@'), p_key);
    v := nextval(p_seq);
    IF v <= lowest THEN
        PERFORM setval(p_seq, lowest);
        v := nextval(p_seq);
    END IF;
    RETURN v;
END
$fn$;
-- The next value of sequence p_seq in this timeline's range; p_key names
-- the sequence in the advisory lock of the move. Also for message ids
-- (queue_ids: a consumer that records the ids it processed must never
-- see one again for another message) and semaphore places. A plain SQL
-- expression, so the planner inlines it (and `fencing_next`)
-- into the statement that draws: the common draw is one `nextval`, a look
-- at the timeline and `currval` (this session's value of that `nextval`),
-- with no procedural call. A value in this timeline's range is one with
-- (v - 1) >> 48 = the timeline, that is T * 2^48 < v <= (T + 1) * 2^48;
-- any other value (below the range after a promotion, or a timeline past
-- 32767, which no bigint value matches) is `timeline_move`'s to handle.
CREATE OR REPLACE FUNCTION @s@.timeline_next(p_seq regclass, p_key integer)
RETURNS bigint
LANGUAGE sql AS $fn$
    SELECT CASE WHEN (nextval(p_seq) - 1) >> 48
                     = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
                THEN currval(p_seq)
                ELSE @s@.timeline_move(p_seq, p_key) END
$fn$;
CREATE OR REPLACE FUNCTION @s@.fencing_next()
RETURNS bigint
LANGUAGE sql AS $fn$
    SELECT @s@.timeline_next('@s@.fencing', 0)
$fn$;

