//! Every SQL text the backend sends, built once per schema.
//!
//! The schema name is a checked identifier and always double-quoted; every
//! user-supplied value (names, owners, candidates, keys) is a bind
//! parameter.

/// The layout version written to `meta`; bump when the DDL changes.
pub(crate) const SCHEMA_VERSION: i32 = 3;

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
            // One statement. First a plain read of the row (`old`, the
            // statement's snapshot): when it is live and held by another,
            // the upsert gets no input row, so a refused attempt takes no
            // row lock, no transaction id and writes nothing (it never
            // queues behind, or in front of, the holder's extend). Only a
            // row that looked free, expired or ours is upserted: taken if
            // it still is (re-checked on the newest version under the row
            // lock); a fresh grant gets a new fencing token from the
            // sequence drawn AFTER the row is locked (in DO UPDATE), so
            // tokens rise in grant order; a repeat by the same live owner
            // keeps its token. The DO UPDATE clauses read the clock again
            // (clock_timestamp() is evaluated on the locked row), so an
            // attempt that waited for the row lock decides on the time it
            // got it. When the row is held by another, the holder's
            // remaining time on the database clock (as of the snapshot)
            // comes back too.
            claim_acquire: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t), \
                 old AS MATERIALIZED (SELECT c.fencing, c.owner, c.expires_at FROM {s}.claims c \
                          WHERE c.kind = $1::text AND c.name = $2::text), \
                 up AS ( \
                   INSERT INTO {s}.claims AS c (kind, name, owner, candidate, fencing, expires_at) \
                   SELECT $1::text, $2::text, $3::bytea, $4::text, nextval('{s}.fencing'), \
                          n.t + $5::int8 * interval '1 microsecond' FROM n \
                    WHERE NOT EXISTS (SELECT 1 FROM old o WHERE o.owner IS NOT NULL \
                                        AND o.owner <> $3::bytea AND o.expires_at > n.t) \
                   ON CONFLICT (kind, name) DO UPDATE \
                     SET owner = EXCLUDED.owner, candidate = EXCLUDED.candidate, \
                         fencing = CASE WHEN c.owner = EXCLUDED.owner AND c.expires_at > clock_timestamp() \
                                        THEN c.fencing ELSE nextval('{s}.fencing') END, \
                         expires_at = clock_timestamp() + $5::int8 * interval '1 microsecond' \
                     WHERE c.owner IS NULL OR c.owner = EXCLUDED.owner OR c.expires_at <= clock_timestamp() \
                   RETURNING c.fencing \
                 ), \
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
            // statement. As for extend, the clock is read once the row is
            // locked: a release that waited past the expiry reports NotHeld.
            claim_release: format!(
                "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.claims c \
                   WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea FOR UPDATE), \
                 n AS MATERIALIZED (SELECT clock_timestamp() AS t FROM l), \
                 r AS ( \
                   UPDATE {s}.claims c SET owner = NULL, candidate = NULL, expires_at = n.t FROM n \
                    WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea AND c.expires_at > n.t \
                   RETURNING c.name \
                 ) \
                 SELECT 1 FROM r LEFT JOIN LATERAL (SELECT pg_notify($4::text, $1::text || ':' || $2::text) WHERE $5::bool) w ON true"
            ),
            // $1 kind, $2 name, $3 owner, $4 ttl µs. Compare-and-expire.
            // The row is locked first (`l`), and the clock read only then
            // (`n` reads it once per locked row), so an extend that waited
            // for the row lock past the expiry resurrects nothing. Another
            // owner's row is not locked at all.
            claim_extend: format!(
                "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.claims c \
                   WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea FOR UPDATE), \
                 n AS MATERIALIZED (SELECT clock_timestamp() AS t FROM l) \
                 UPDATE {s}.claims c SET expires_at = n.t + $4::int8 * interval '1 microsecond' FROM n \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea AND c.expires_at > n.t \
                 RETURNING 1"
            ),
            // $1 kind, $2 name, $3 channel, $4 notify.
            claim_force_release: format!(
                "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.claims c \
                   WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL FOR UPDATE), \
                 n AS MATERIALIZED (SELECT clock_timestamp() AS t FROM l), \
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
                "SELECT generation, complete, started_with FROM {s}.barrier_arrive($1::text, $2::int4, $3::text, $4::text, $5::text)"
            ),
            // $1 name, $2 generation.
            barrier_is_complete: format!(
                "SELECT b.generation > $2::int8 FROM {s}.barriers b WHERE b.name = $1::text"
            ),
            // $1 name, $2 generation, $3 participant.
            barrier_withdraw: format!("SELECT {s}.barrier_withdraw($1::text, $2::int8, $3::text)"),
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
    let mut text = format!("SELECT pg_advisory_xact_lock(hashtext('coord-schema:{schema}'));\n");
    for part in [
        include_str!("sql/schema.sql"),
        include_str!("sql/barrier.sql"),
        include_str!("sql/limiter.sql"),
    ] {
        text.push_str(&part.replace("@s@", s));
        text.push('\n');
    }
    text.push_str(&format!(
        "INSERT INTO {s}.meta (id, version) VALUES (1, {SCHEMA_VERSION})\n\
         ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version;"
    ));
    text
}
