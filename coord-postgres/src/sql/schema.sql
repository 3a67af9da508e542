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
-- Locks, leases and leaderships: one row per (kind, name), kept when
-- released (owner NULL) so the row's history survives.
CREATE TABLE IF NOT EXISTS @s@.claims (
    kind text NOT NULL,
    name text NOT NULL,
    owner bytea,
    candidate text,
    fencing bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, name)
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS @s@.barriers (
    name text PRIMARY KEY,
    parties integer NOT NULL,
    generation bigint NOT NULL,
    members text[] NOT NULL DEFAULT '{}',
    passed text[] NOT NULL DEFAULT '{}'
);
-- member_ids: the arrival id of each member (same order as members);
-- passed_ids / passed_generation: the arrival ids of the generation that
-- completed last, so a retried completing arrival is recognised (layout 3).
ALTER TABLE @s@.barriers
    ADD COLUMN IF NOT EXISTS member_ids text[] NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS passed_ids text[] NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS passed_generation bigint;
-- One row per (algorithm, key). Times in microseconds since the Unix epoch
-- on the database clock. q_limit / q_window: the quota the state was last
-- written under (NULL: no state yet; rows of layout version 1 start
-- afresh). window_start: start of the current (fixed or sliding) window;
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
    PRIMARY KEY (algorithm, key)
);
ALTER TABLE @s@.limiter_state
    ADD COLUMN IF NOT EXISTS q_limit bigint,
    ADD COLUMN IF NOT EXISTS q_window bigint,
    ADD COLUMN IF NOT EXISTS retain bigint,
    ADD COLUMN IF NOT EXISTS tat_x numeric;
CREATE TABLE IF NOT EXISTS @s@.limiter_log (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    at bigint NOT NULL,
    cost bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS limiter_log_key_at ON @s@.limiter_log (key, at);
