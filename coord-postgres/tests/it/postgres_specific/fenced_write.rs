//! The fenced-write helper applies a write iff its token is at least the
//! row's, and rejects a stale token.

use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_postgres::tokio_postgres::types::Type;
use coord_postgres::{FencedTable, FencedWrite};

use super::unique;

/// The fenced-write helper applies a write iff its token is >= the row's
/// stored token, and rejects a stale holder's late write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_rejects_a_stale_token() {
    let schema = unique("fence");
    let backend = coord_postgres::builder(&cluster().url())
        .schema(schema.clone())
        .connect_backend()
        .await
        .unwrap();
    let client = backend.pool().get().await.unwrap();
    let table = unique("accounts");
    client
        .batch_execute(&format!(
            "CREATE TABLE \"{table}\" (id text PRIMARY KEY, balance bigint NOT NULL, \
             fencing_token bigint NOT NULL DEFAULT 0); \
             INSERT INTO \"{table}\" VALUES ('acct-1', 100, 0)"
        ))
        .await
        .unwrap();
    let fenced = FencedTable::new(&table, "id", "fencing_token").unwrap();
    let coord = backend.coord();
    let locks = coord.locks().unwrap();

    // Holder 1 takes the lock, then loses it (forced release stands in for
    // an expiry behind its back); holder 2 takes it and writes.
    let g1 = locks
        .try_acquire("acct-1", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let t1 = g1.fencing_token();
    assert!(locks.force_release("acct-1").await.unwrap());
    let g2 = locks
        .try_acquire("acct-1", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let t2 = g2.fencing_token();
    assert!(t2 > t1);
    let key = "acct-1";
    let v = 150_i64;
    let w = fenced
        .update(
            &**client,
            (&key, Type::TEXT),
            t2,
            &[("balance", &v, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Applied);
    // The same token again is accepted (>=).
    let v = 160_i64;
    assert!(
        fenced
            .update(
                &**client,
                (&key, Type::TEXT),
                t2,
                &[("balance", &v, Type::INT8)]
            )
            .await
            .unwrap()
            .applied()
    );
    // Holder 1 wakes up late and writes: refused, nothing changed.
    let stale = 1_i64;
    let w = fenced
        .update(
            &**client,
            (&key, Type::TEXT),
            t1,
            &[("balance", &stale, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(w, FencedWrite::Stale);
    let row = client
        .query_one(
            &format!("SELECT balance, fencing_token FROM \"{table}\" WHERE id = 'acct-1'"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 160);
    assert_eq!(row.get::<_, i64>(1) as u64, t2.get());
    // Missing rows are told apart; upsert inserts them, then fences them.
    let other = "acct-2";
    assert_eq!(
        fenced
            .update(
                &**client,
                (&other, Type::TEXT),
                t2,
                &[("balance", &v, Type::INT8)]
            )
            .await
            .unwrap(),
        FencedWrite::Missing
    );
    assert!(
        fenced
            .upsert(
                &**client,
                (&other, Type::TEXT),
                t2,
                &[("balance", &v, Type::INT8)]
            )
            .await
            .unwrap()
            .applied()
    );
    assert_eq!(
        fenced
            .upsert(
                &**client,
                (&other, Type::TEXT),
                t1,
                &[("balance", &stale, Type::INT8)]
            )
            .await
            .unwrap(),
        FencedWrite::Stale
    );
    // The key and token columns cannot be set by hand; identifiers are
    // checked.
    assert!(
        fenced
            .update(
                &**client,
                (&key, Type::TEXT),
                t2,
                &[("id", &other, Type::TEXT)]
            )
            .await
            .is_err()
    );
    assert!(FencedTable::new("x; DROP TABLE y", "id", "t").is_err());
    assert!(FencedTable::new("public.accounts", "id", "fencing_token").is_ok());
    g2.release().await.unwrap();
    drop(g1);
}
