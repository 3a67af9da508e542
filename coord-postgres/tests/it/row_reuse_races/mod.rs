//! Claim rows reused in place, under races: each race the reuse opens is
//! forced deterministically, with a second connection holding a
//! transaction open at the exact point (a take, an extend, the sweep's
//! delete, a new name's insert) while the backend's statement waits behind
//! it, then committing or rolling back; a fault-injected stall between a
//! take's token draw and its row lock checks that the re-check
//! (EvalPlanQual) draws again; a churn of grants, releases, expiries,
//! stale releases and extends and a grace-0 sweep checks that no two
//! owners hold a name at once and tokens rise; and a layout-10 client
//! beside upgraded ones checks the upgrade caveat's bound.
//!
//! This file holds the helpers the files below share: backends, a raw
//! take and reading a name's row.

use crate::support;
use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::OwnerToken;
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::Client;
use support::psql;

mod churn;
mod reused_rows;
mod stalled_draw;
mod waiting_behind_a_transaction;
mod wakeups;

const GRACE: Duration = Duration::from_millis(100);

async fn backend_with(schema: &str, grace: Duration) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .schema(schema.to_string())
        .idle_grace(grace)
        .sweep_every(None)
        .connect_backend()
        .await
        .expect("connect")
}

async fn backend(schema: &str) -> Arc<PostgresBackend> {
    backend_with(schema, GRACE).await
}

/// The text of `claim_take` without metadata (src/sql.rs), for a raw
/// connection to run inside a transaction it keeps open.
fn take_sql(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "WITH l AS MATERIALIZED (SELECT 1 AS ok \
           WHERE CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN true \
                      ELSE {s}.not_read_committed() END), \
         u AS ( \
           UPDATE {s}.claims c \
              SET owner = $3::bytea, candidate = $4::text, fencing = {s}.fencing_next(), \
                  metadata = NULL::bytea, \
                  expires_at = clock_timestamp() + $5::int8 * interval '1 microsecond', \
                  waiting = c.owner IS NOT NULL AND c.waiting \
             FROM l \
            WHERE c.kind = $1::text AND c.name = $2::text \
              AND (c.owner IS NULL OR c.expires_at <= clock_timestamp()) \
           RETURNING c.fencing) \
         SELECT u.fencing FROM u \
         UNION ALL \
         SELECT i.f FROM ( \
           SELECT {s}.claim_insert($1::text, $2::text, $3::bytea, $4::text, $5::int8, NULL::bytea, NULL::int8) AS f \
             FROM l \
            WHERE NOT EXISTS (SELECT 1 FROM {s}.claims x WHERE x.kind = $1::text AND x.name = $2::text) \
           OFFSET 0) i \
          WHERE i.f IS NOT NULL"
    )
}

/// A raw take of `name` (kind lock) by `owner`: the token, if granted.
async fn raw_take(
    c: &Client,
    schema: &str,
    name: &str,
    owner: &OwnerToken,
    ttl_us: i64,
) -> Option<i64> {
    let owner: &[u8] = owner.as_bytes();
    let rows = c
        .query(
            &take_sql(schema),
            &[&"lock", &name, &owner, &None::<String>, &ttl_us],
        )
        .await
        .expect("raw take");
    assert!(rows.len() <= 1, "a take returned {} rows", rows.len());
    rows.first().map(|r| r.get(0))
}

/// The row of a lock name as text: owner hex | fencing | expires_at | xmin | waiting.
fn row(schema: &str, name: &str) -> String {
    psql(&format!(
        "SELECT coalesce(encode(owner, 'hex'), '-') || '|' || fencing || '|' || expires_at \
                || '|' || xmin || '|' || waiting \
           FROM \"{schema}\".claims WHERE kind = 'lock' AND name = '{name}'"
    ))
}
