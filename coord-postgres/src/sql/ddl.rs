//! The layout's DDL: every table and function of a schema, created in one
//! transaction, and the SQLSTATEs with which it stops.

use super::SCHEMA_VERSION;

/// The SQLSTATE with which the layout's DDL stops when a concurrent first
/// user created the current schema while this one waited for the lock.
pub(crate) const SCHEMA_CURRENT: &str = "C0D01";

/// The SQLSTATE with which the layout's DDL stops when the schema holds
/// another layout version (its message names it).
pub(crate) const SCHEMA_OTHER: &str = "C0D02";

/// The whole layout, created in one transaction (one simple-query message:
/// an implicit transaction that leaves no state behind on error) under a transaction-scoped
/// advisory lock so that clients starting together on an empty database
/// never race on `CREATE ... IF NOT EXISTS`.
pub(super) fn ddl(s: &str, schema: &str) -> String {
    // `schema` is a checked identifier (letters, digits, `_`), so it is
    // safe inside the string literal of the advisory lock key as well.
    let mut text = format!("SELECT pg_advisory_xact_lock(hashtext('coord-schema:{schema}'));\n");
    // A first user whose version check raced another's creation of the
    // schema finds it current once it holds the lock: it stops here
    // (SQLSTATE `SCHEMA_CURRENT`, taken as success) instead of running DDL
    // that would lock tables other clients are already working on (they
    // would wait behind it, or be aborted as a deadlock with it). A
    // session that still caches the schema's absence does not find it and
    // runs the DDL as before (see `ensure_schema`).
    text.push_str(&format!(
        "DO $current$ BEGIN\n\
           IF to_regclass('{s}.meta') IS NOT NULL THEN\n\
             IF (SELECT m.version FROM {s}.meta m WHERE m.id = 1) = {SCHEMA_VERSION} THEN\n\
               RAISE EXCEPTION 'coord: the schema is current' USING ERRCODE = '{SCHEMA_CURRENT}';\n\
             ELSIF (SELECT m.version FROM {s}.meta m WHERE m.id = 1) IS NOT NULL THEN\n\
               RAISE EXCEPTION '%', (SELECT m.version FROM {s}.meta m WHERE m.id = 1)\n\
                 USING ERRCODE = '{SCHEMA_OTHER}';\n\
             END IF;\n\
           END IF;\n\
         END $current$;\n"
    ));
    let claims = include_str!("claims.sql").replace("@schema@", schema);
    let semaphore = include_str!("semaphore.sql").replace("@schema@", schema);
    let queue = include_str!("queue.sql").replace("@schema@", schema);
    for part in [
        &include_str!("schema.sql").replace("@schema@", schema),
        &claims,
        include_str!("barrier.sql"),
        include_str!("limiter.sql"),
        &semaphore,
        &queue,
        include_str!("sweep.sql"),
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
