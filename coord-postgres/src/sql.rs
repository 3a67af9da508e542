//! Every SQL text the backend sends, built once per schema.
//!
//! The schema name is a checked identifier and always double-quoted; every
//! user-supplied value (names, owners, candidates, keys) is a bind
//! parameter.

/// The layout version written to `meta`; bump when the DDL changes.
pub(crate) const SCHEMA_VERSION: i32 = 1;

/// The prepared texts for one schema.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) check_version: String,
    pub(crate) ddl: String,
    pub(crate) claim_acquire: String,
    pub(crate) claim_release: String,
    pub(crate) claim_extend: String,
    pub(crate) claim_force_release: String,
    pub(crate) claim_remaining: String,
    pub(crate) leader: String,
    pub(crate) fencing_next: String,
    pub(crate) barrier_arrive: String,
    pub(crate) barrier_is_complete: String,
    pub(crate) barrier_withdraw: String,
    pub(crate) limiter_check: String,
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Sql {
        let s = format!("\"{schema}\"");
        Sql {
            check_version: format!("SELECT version FROM {s}.meta WHERE id = 1"),
            ddl: ddl(&s, schema),
            // $1 kind, $2 name, $3 owner, $4 candidate, $5 ttl µs,
            // $6 channel, $7 notify on a fresh grant.
            //
            // One statement: take the row if it is free, expired or ours;
            // a fresh grant gets a new fencing token from the sequence in
            // the same statement, drawn AFTER the row is locked (in DO
            // UPDATE), so tokens rise in grant order; a repeat by the same
            // live owner keeps its token. When the row is held by another,
            // the holder's remaining time on the database clock (as of the
            // statement's snapshot) comes back too. `old` is that snapshot,
            // which data-modifying CTEs do not change.
            claim_acquire: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), \
                 up AS ( \
                   INSERT INTO {s}.claims AS c (kind, name, owner, candidate, fencing, expires_at) \
                   SELECT $1::text, $2::text, $3::bytea, $4::text, nextval('{s}.fencing'), \
                          n.t + $5::int8 * interval '1 microsecond' FROM n \
                   ON CONFLICT (kind, name) DO UPDATE \
                     SET owner = EXCLUDED.owner, candidate = EXCLUDED.candidate, \
                         fencing = CASE WHEN c.owner = EXCLUDED.owner AND c.expires_at > (SELECT t FROM n) \
                                        THEN c.fencing ELSE nextval('{s}.fencing') END, \
                         expires_at = EXCLUDED.expires_at \
                     WHERE c.owner IS NULL OR c.owner = EXCLUDED.owner OR c.expires_at <= (SELECT t FROM n) \
                   RETURNING c.fencing \
                 ), \
                 old AS (SELECT c.fencing, c.owner, c.expires_at FROM {s}.claims c \
                          WHERE c.kind = $1::text AND c.name = $2::text), \
                 woke AS (SELECT pg_notify($6::text, $1::text || ':' || $2::text) FROM up \
                           WHERE $7::bool AND up.fencing IS DISTINCT FROM (SELECT fencing FROM old)) \
                 SELECT (SELECT fencing FROM up) AS granted, \
                        (SELECT (extract(epoch FROM (o.expires_at - n.t)) * 1000000)::int8 \
                           FROM old o, n WHERE o.owner IS NOT NULL) AS held_us, \
                        (SELECT count(*) FROM woke) AS woke"
            ),
            // $1 kind, $2 name, $3 owner, $4 channel, $5 notify.
            // Compare-and-release; the row (and so nothing of the token
            // history) is kept. The NOTIFY is sent at commit of this same
            // statement.
            claim_release: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), \
                 r AS ( \
                   UPDATE {s}.claims c SET owner = NULL, candidate = NULL, expires_at = n.t FROM n \
                    WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea AND c.expires_at > n.t \
                   RETURNING c.name \
                 ) \
                 SELECT 1 FROM r LEFT JOIN LATERAL (SELECT pg_notify($4::text, $1::text || ':' || $2::text) WHERE $5::bool) w ON true"
            ),
            // $1 kind, $2 name, $3 owner, $4 ttl µs. Compare-and-expire.
            claim_extend: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 UPDATE {s}.claims c SET expires_at = n.t + $4::int8 * interval '1 microsecond' FROM n \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea AND c.expires_at > n.t \
                 RETURNING 1"
            ),
            // $1 kind, $2 name, $3 channel, $4 notify.
            claim_force_release: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), \
                 r AS ( \
                   UPDATE {s}.claims c SET owner = NULL, candidate = NULL, expires_at = n.t FROM n \
                    WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL AND c.expires_at > n.t \
                   RETURNING c.name \
                 ) \
                 SELECT 1 FROM r LEFT JOIN LATERAL (SELECT pg_notify($3::text, $1::text || ':' || $2::text) WHERE $4::bool) w ON true"
            ),
            // $1 kind, $2 name.
            claim_remaining: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 SELECT (extract(epoch FROM (c.expires_at - n.t)) * 1000000)::int8 \
                   FROM {s}.claims c, n \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL AND c.expires_at > n.t"
            ),
            // $1 name.
            leader: format!(
                "SELECT c.candidate, c.fencing FROM {s}.claims c \
                  WHERE c.kind = 'election' AND c.name = $1::text AND c.owner IS NOT NULL \
                    AND c.expires_at > clock_timestamp()"
            ),
            fencing_next: format!("SELECT nextval('{s}.fencing')"),
            // $1 name, $2 parties, $3 participant, $4 channel.
            barrier_arrive: format!(
                "SELECT generation, complete, started_with FROM {s}.barrier_arrive($1::text, $2::int4, $3::text, $4::text)"
            ),
            // $1 name, $2 generation.
            barrier_is_complete: format!(
                "SELECT b.generation > $2::int8 FROM {s}.barriers b WHERE b.name = $1::text"
            ),
            // $1 name, $2 generation, $3 participant.
            barrier_withdraw: format!(
                "WITH u AS ( \
                   UPDATE {s}.barriers b SET members = array_remove(b.members, $3::text) \
                    WHERE b.name = $1::text AND b.generation = $2::int8 RETURNING 1 \
                 ) \
                 SELECT EXISTS (SELECT 1 FROM u), \
                        EXISTS (SELECT 1 FROM {s}.barriers b WHERE b.name = $1::text AND b.generation > $2::int8)"
            ),
            // $1 algorithm, $2 key, $3 limit, $4 window µs, $5 cost.
            limiter_check: format!(
                "SELECT allowed, remaining, retry_after, reset_after FROM {s}.limiter_check($1::text, $2::text, $3::int8, $4::int8, $5::int8)"
            ),
        }
    }
}

/// The whole layout, created in one transaction (one simple-query message:
/// an implicit transaction that leaves no state behind on error) under a transaction-scoped
/// advisory lock so that clients starting together on an empty database
/// never race on `CREATE ... IF NOT EXISTS`.
fn ddl(s: &str, schema: &str) -> String {
    // `schema` is a checked identifier (letters, digits, `_`), so it is
    // safe inside the string literal of the advisory lock key as well.
    format!(
        r#"SELECT pg_advisory_xact_lock(hashtext('coord-schema:{schema}'));
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.meta (
    id integer PRIMARY KEY CHECK (id = 1),
    version integer NOT NULL
);
-- One counter for every fencing token this schema hands out: lock grants,
-- lease grants, election terms and FencingSource::next. Sequences are
-- WAL-logged, so tokens keep rising across restarts and crashes.
CREATE SEQUENCE IF NOT EXISTS {s}.fencing AS bigint;
-- Locks, leases and leaderships: one row per (kind, name), kept when
-- released (owner NULL) so the row's history survives.
CREATE TABLE IF NOT EXISTS {s}.claims (
    kind text NOT NULL,
    name text NOT NULL,
    owner bytea,
    candidate text,
    fencing bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (kind, name)
) WITH (fillfactor = 70);
CREATE TABLE IF NOT EXISTS {s}.barriers (
    name text PRIMARY KEY,
    parties integer NOT NULL,
    generation bigint NOT NULL,
    members text[] NOT NULL DEFAULT '{{}}',
    passed text[] NOT NULL DEFAULT '{{}}'
);
CREATE TABLE IF NOT EXISTS {s}.limiter_state (
    algorithm text NOT NULL,
    key text NOT NULL,
    window_start bigint NOT NULL DEFAULT 0,
    cur bigint NOT NULL DEFAULT 0,
    prev bigint NOT NULL DEFAULT 0,
    tat double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (algorithm, key)
);
CREATE TABLE IF NOT EXISTS {s}.limiter_log (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    at bigint NOT NULL,
    cost bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS limiter_log_key_at ON {s}.limiter_log (key, at);

CREATE OR REPLACE FUNCTION {s}.barrier_arrive(
    p_name text, p_parties integer, p_participant text, p_channel text,
    OUT generation bigint, OUT complete boolean, OUT started_with integer)
LANGUAGE plpgsql AS $fn$
DECLARE
    b {s}.barriers%ROWTYPE;
BEGIN
    INSERT INTO {s}.barriers AS x (name, parties, generation)
    VALUES (p_name, p_parties, 1) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO b FROM {s}.barriers x WHERE x.name = p_name FOR UPDATE;
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
        UPDATE {s}.barriers x
           SET generation = b.generation + 1, members = '{{}}', passed = b.members, parties = p_parties
         WHERE x.name = p_name;
        PERFORM pg_notify(p_channel, 'barrier:' || p_name);
        complete := true;
    ELSE
        UPDATE {s}.barriers x SET members = b.members, parties = p_parties WHERE x.name = p_name;
    END IF;
END
$fn$;

-- One check: decide on an unlocked read first; a denial decided there is
-- final (admissions only ever add to the state, so the newest state would
-- deny too) and writes nothing. Otherwise decide again on the row locked
-- FOR UPDATE and record the admission: the check-and-record is atomic.
CREATE OR REPLACE FUNCTION {s}.limiter_check(
    p_algo text, p_key text, p_limit bigint, p_window bigint, p_cost bigint,
    OUT allowed boolean, OUT remaining bigint, OUT retry_after bigint, OUT reset_after bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    now_us bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    st {s}.limiter_state%ROWTYPE;
    w bigint;
    elapsed bigint;
    weight double precision;
    est double precision;
    used bigint;
    acc bigint;
    e record;
    t double precision;
    tat double precision;
    new_tat double precision;
    need double precision;
    seen boolean := false;
BEGIN
    IF p_algo NOT IN ('sliding_log', 'fixed_window', 'sliding_window', 'gcra') THEN
        RAISE EXCEPTION 'coord: unknown limiter algorithm %', p_algo;
    END IF;
    FOR pass IN 1..2 LOOP
        retry_after := 0;
        IF pass = 1 THEN
            SELECT * INTO st FROM {s}.limiter_state x
             WHERE x.algorithm = p_algo AND x.key = p_key;
            IF NOT FOUND THEN
                CONTINUE;
            END IF;
            seen := true;
        ELSE
            -- Limiter decisions are not grants: commit them without waiting
            -- for the WAL flush, so a hot key is not held to one check per
            -- fsync. A crash may forget the last fraction of a second of
            -- admissions.
            PERFORM set_config('synchronous_commit', 'off', true);
            IF NOT seen THEN
                INSERT INTO {s}.limiter_state AS x (algorithm, key) VALUES (p_algo, p_key)
                ON CONFLICT (algorithm, key) DO NOTHING;
            END IF;
            IF p_algo <> 'gcra' THEN
                SELECT * INTO st FROM {s}.limiter_state x
                 WHERE x.algorithm = p_algo AND x.key = p_key FOR UPDATE;
            END IF;
        END IF;

        IF p_algo = 'sliding_log' THEN
            SELECT coalesce(sum(l.cost), 0) INTO used FROM {s}.limiter_log l
             WHERE l.key = p_key AND l.at > now_us - p_window;
            allowed := used + p_cost <= p_limit;
            IF allowed AND pass = 2 THEN
                DELETE FROM {s}.limiter_log l WHERE l.key = p_key AND l.at <= now_us - p_window;
                INSERT INTO {s}.limiter_log (key, at, cost) VALUES (p_key, now_us, p_cost);
                used := used + p_cost;
            END IF;
            IF NOT allowed THEN
                acc := 0;
                FOR e IN SELECT l.at, l.cost FROM {s}.limiter_log l
                          WHERE l.key = p_key AND l.at > now_us - p_window
                          ORDER BY l.at, l.id LOOP
                    acc := acc + e.cost;
                    IF used - acc + p_cost <= p_limit THEN
                        retry_after := greatest(1, e.at + p_window - now_us);
                        EXIT;
                    END IF;
                END LOOP;
                IF retry_after = 0 THEN
                    retry_after := p_window;
                END IF;
            END IF;
            remaining := greatest(0, p_limit - used);
            SELECT coalesce(max(l.at) + p_window - now_us, 0) INTO reset_after
              FROM {s}.limiter_log l WHERE l.key = p_key AND l.at > now_us - p_window;
            reset_after := greatest(0, reset_after);
        ELSIF p_algo = 'fixed_window' THEN
            w := now_us / p_window;
            IF st.window_start <> w THEN
                st.window_start := w;
                st.cur := 0;
            END IF;
            t := (w + 1) * p_window - now_us;
            allowed := st.cur + p_cost <= p_limit;
            IF allowed THEN
                st.cur := st.cur + p_cost;
            ELSE
                retry_after := greatest(1, t::bigint);
            END IF;
            remaining := greatest(0, p_limit - st.cur);
            reset_after := CASE WHEN st.cur > 0 THEN t::bigint ELSE 0 END;
            IF allowed AND pass = 2 THEN
                UPDATE {s}.limiter_state x SET window_start = st.window_start, cur = st.cur
                 WHERE x.algorithm = p_algo AND x.key = p_key;
            END IF;
        ELSIF p_algo = 'sliding_window' THEN
            w := now_us / p_window;
            IF st.window_start = w THEN
                NULL;
            ELSIF st.window_start = w - 1 THEN
                st.prev := st.cur;
                st.cur := 0;
            ELSE
                st.prev := 0;
                st.cur := 0;
            END IF;
            st.window_start := w;
            elapsed := now_us - w * p_window;
            weight := (p_window - elapsed)::double precision / p_window;
            est := st.prev * weight + st.cur;
            allowed := est + p_cost <= p_limit;
            IF allowed THEN
                st.cur := st.cur + p_cost;
                est := est + p_cost;
            ELSIF st.prev > 0 AND p_limit - st.cur - p_cost >= 0 THEN
                -- The previous window's weight decays enough within this one.
                need := p_window - (p_limit - st.cur - p_cost)::double precision * p_window / st.prev;
                retry_after := greatest(1, ceil(need - elapsed)::bigint + 1);
            ELSE
                -- Only in the next window, where this window's count is the
                -- previous one.
                need := CASE WHEN st.cur > 0
                             THEN greatest(0, p_window - (p_limit - p_cost)::double precision * p_window / st.cur)
                             ELSE 0 END;
                retry_after := greatest(1, (p_window - elapsed) + ceil(need)::bigint + 1);
            END IF;
            remaining := greatest(0, floor(p_limit - est)::bigint);
            reset_after := CASE WHEN st.cur > 0 THEN (p_window - elapsed) + p_window
                                WHEN st.prev > 0 THEN p_window - elapsed
                                ELSE 0 END;
            IF allowed AND pass = 2 THEN
                UPDATE {s}.limiter_state x SET window_start = st.window_start, cur = st.cur, prev = st.prev
                 WHERE x.algorithm = p_algo AND x.key = p_key;
            END IF;
        ELSE
            -- GCRA: emission interval window/limit, burst tolerance one
            -- window, so a full bucket admits `limit` at once, then one per
            -- interval. The locked pass is one conditional UPDATE: waiters
            -- re-check the condition on the newest row after the holder
            -- commits, and a denied one never holds the lock.
            t := p_window::double precision / p_limit;
            allowed := false;
            IF pass = 2 THEN
                UPDATE {s}.limiter_state x SET tat = greatest(x.tat, now_us::double precision) + p_cost * t
                 WHERE x.algorithm = p_algo AND x.key = p_key
                   AND now_us + 0.001 >= greatest(x.tat, now_us::double precision) + p_cost * t - p_window
                RETURNING x.tat INTO new_tat;
                IF FOUND THEN
                    allowed := true;
                ELSE
                    SELECT * INTO st FROM {s}.limiter_state x
                     WHERE x.algorithm = p_algo AND x.key = p_key;
                END IF;
            END IF;
            IF NOT allowed THEN
                tat := greatest(st.tat, now_us::double precision);
                new_tat := tat + p_cost * t;
                allowed := pass = 1 AND now_us + 0.001 >= new_tat - p_window;
            END IF;
            IF allowed THEN
                remaining := greatest(0, floor((now_us + p_window - new_tat) / t + 0.000001)::bigint);
                reset_after := greatest(0, ceil(new_tat - now_us)::bigint);
            ELSE
                retry_after := greatest(1, ceil(new_tat - p_window - now_us)::bigint);
                remaining := greatest(0, floor((now_us + p_window - tat) / t + 0.000001)::bigint);
                reset_after := greatest(0, ceil(tat - now_us)::bigint);
            END IF;
        END IF;
        IF NOT allowed OR pass = 2 THEN
            RETURN;
        END IF;
    END LOOP;
END
$fn$;

INSERT INTO {s}.meta (id, version) VALUES (1, {SCHEMA_VERSION})
ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version;"#
    )
}
