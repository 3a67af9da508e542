//! A statement waiting behind another transaction on the same row (the
//! re-check, EvalPlanQual): a take behind a take wins only if that one
//! rolls back, a take of an expired version behind its extend is refused,
//! a stale release and extend behind a takeover change nothing, and takes
//! behind the sweep's delete get a new row with a higher token.

use crate::support;
use std::time::Duration;

use coord_core::{Attempt, FencingToken, Lock, OwnerToken};
use support::{granted, psql, raw, unique, wait_blocked};

use super::{GRACE, backend, raw_take, row};

/// The text of `claim_extend` (src/sql.rs).
fn extend_sql(schema: &str) -> String {
    let s = format!("\"{schema}\"");
    format!(
        "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.claims c \
           WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea FOR UPDATE), \
         n AS MATERIALIZED (SELECT clock_timestamp() AS t FROM l) \
         UPDATE {s}.claims c SET expires_at = n.t + $4::int8 * interval '1 microsecond' FROM n \
          WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea AND c.expires_at > n.t \
         RETURNING 1"
    )
}

/// EvalPlanQual, take vs take: a take waiting for the row lock of another
/// take in flight on the same free row is refused once that one commits
/// (the holder keeps its token), and granted with a higher token once it
/// rolls back. Also for a new name (the waiting take's placeholder insert
/// waits for the other's index entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_waiting_behind_another_take_wins_only_if_that_one_rolls_back() {
    let schema = unique("rv_tt");
    let b = backend(&schema).await;
    let ttl = Duration::from_secs(30);
    for (fresh, commit) in [(false, true), (false, false), (true, true), (true, false)] {
        let name = format!("n_{fresh}_{commit}");
        let mut before = FencingToken(0);
        if !fresh {
            let x = OwnerToken::random();
            before = granted(b.try_acquire(&name, x.step(), ttl).await.unwrap());
            assert!(Lock::release(&*b, &name, x.step()).await.unwrap());
        }
        let c1 = raw().await;
        c1.batch_execute("BEGIN").await.unwrap();
        let a = OwnerToken::random();
        let ta = raw_take(&c1, &schema, &name, &a, 30_000_000)
            .await
            .expect("the first take is granted");
        assert!(ta as u64 > before.get());
        let bo = OwnerToken::random();
        let waiting = tokio::spawn({
            let (b, name, bo) = (b.clone(), name.clone(), bo);
            async move { b.try_acquire(&name, bo.step(), ttl).await.unwrap() }
        });
        wait_blocked(&schema, 1).await;
        assert!(!waiting.is_finished());
        c1.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        let r = waiting.await.unwrap();
        let holders = Lock::inspect(&*b, &name).await.unwrap().holders;
        assert_eq!(holders.len(), 1, "{name}: holders {holders:?}");
        if commit {
            assert!(
                !matches!(r, Attempt::Granted(_)),
                "{name}: granted {r:?} while {ta} is held"
            );
            assert_eq!(holders[0].owner, a);
            assert_eq!(holders[0].token.get(), ta as u64);
        } else {
            let tb = granted(r);
            assert!(tb.get() > ta as u64, "{name}: {tb:?} after a drawn {ta}");
            assert_eq!(holders[0].owner, bo);
        }
        assert_eq!(
            psql(&format!(
                "SELECT count(*) FROM \"{schema}\".claims WHERE name = '{name}'"
            )),
            "1"
        );
    }
}

/// EvalPlanQual, take vs extend: the holder's extend runs before its
/// expiry but commits after it. A take that saw the old, expired version
/// waits for the extend's row lock and is then refused; the holder keeps
/// its token and the extended expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_of_an_expired_version_waiting_behind_its_extend_is_refused() {
    let schema = unique("rv_te");
    let b = backend(&schema).await;
    let x = OwnerToken::random();
    // The extend's connection and transaction first: under load a connect
    // can outlast the 400 ms TTL, and the extend must run while it lives.
    let c1 = raw().await;
    c1.batch_execute("BEGIN").await.unwrap();
    let tx = granted(
        b.try_acquire("e", x.step(), Duration::from_millis(400))
            .await
            .unwrap(),
    );
    let xb: &[u8] = x.as_bytes();
    let n = c1
        .query(&extend_sql(&schema), &[&"lock", &"e", &xb, &30_000_000i64])
        .await
        .unwrap();
    assert_eq!(n.len(), 1, "the live holder's extend");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let bo = OwnerToken::random();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move {
            b.try_acquire("e", bo.step(), Duration::from_secs(30))
                .await
                .unwrap()
        }
    });
    wait_blocked(&schema, 1).await;
    c1.batch_execute("COMMIT").await.unwrap();
    let r = waiting.await.unwrap();
    assert!(
        !matches!(r, Attempt::Granted(_)),
        "taken ({r:?}) over an extended holder"
    );
    let h = Lock::inspect(&*b, "e").await.unwrap().holders;
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].owner, x);
    assert_eq!(h[0].token, tx);
    assert!(h[0].remaining.unwrap() > Duration::from_secs(20));
}

/// A stale owner's release and extend that wait behind a takeover of its
/// expired row change nothing once the takeover commits (the new holder's
/// row is byte for byte the same, same xmin), and report NotHeld; after a
/// rolled-back takeover the stale release frees its own expired row
/// (reporting NotHeld) and the extend resurrects nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_release_and_extend_behind_a_takeover_change_nothing() {
    let schema = unique("rv_st");
    let b = backend(&schema).await;
    for commit in [true, false] {
        let name = format!("s_{commit}");
        let a = OwnerToken::random();
        let t0 = granted(
            b.try_acquire(&name, a.step(), Duration::from_millis(300))
                .await
                .unwrap(),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let c1 = raw().await;
        c1.batch_execute("BEGIN").await.unwrap();
        let nb = OwnerToken::random();
        let tb = raw_take(&c1, &schema, &name, &nb, 30_000_000)
            .await
            .expect("a takeover of the expired row");
        assert!(tb as u64 > t0.get());
        let rel = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move { Lock::release(&*b, &name, a.step()).await.unwrap() }
        });
        let ext = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move {
                Lock::extend(&*b, &name, a.step(), Duration::from_secs(60))
                    .await
                    .unwrap()
            }
        });
        wait_blocked(&schema, 2).await;
        c1.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
        let after_commit = row(&schema, &name);
        assert!(!rel.await.unwrap(), "a stale release reported held");
        assert!(!ext.await.unwrap(), "a stale extend succeeded");
        let now = row(&schema, &name);
        if commit {
            assert_eq!(now, after_commit, "the stale owner's calls changed the row");
            assert!(now.starts_with(&nb.to_hex()), "{now}");
            let h = Lock::inspect(&*b, &name).await.unwrap().holders;
            assert_eq!(h[0].owner, nb);
            assert_eq!(h[0].token.get(), tb as u64);
        } else {
            assert!(Lock::inspect(&*b, &name).await.unwrap().holders.is_empty());
            let next = granted(
                b.try_acquire(&name, OwnerToken::random().step(), Duration::from_secs(30))
                    .await
                    .unwrap(),
            );
            assert!(next.get() > tb as u64);
        }
        // A second stale round, on the settled row: nothing changes.
        let settled = row(&schema, &name);
        assert!(!Lock::release(&*b, &name, a.step()).await.unwrap());
        assert!(
            !Lock::extend(&*b, &name, a.step(), Duration::from_secs(60))
                .await
                .unwrap()
        );
        assert_eq!(row(&schema, &name), settled);
    }
}

/// The sweep's delete in flight: takes that saw the row (one raw, one by
/// the backend) wait for it, find it deleted, and the backend's attempt
/// then grants a new row with a higher token than the swept one; a raw
/// take on the deleted version grants nothing. Released and expired rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_waiting_behind_the_sweeps_delete_get_a_new_row_with_a_higher_token() {
    let schema = unique("rv_sw");
    let b = backend(&schema).await;
    for release in [true, false] {
        let name = format!("w_{release}");
        let x = OwnerToken::random();
        // Long enough for the release right after the grant to find it
        // held on a loaded machine.
        let ttl = Duration::from_secs(1);
        let tx = granted(b.try_acquire(&name, x.step(), ttl).await.unwrap());
        if release {
            assert!(Lock::release(&*b, &name, x.step()).await.unwrap());
        }
        tokio::time::sleep(ttl + GRACE + Duration::from_millis(150)).await;
        let c1 = raw().await;
        c1.batch_execute("BEGIN").await.unwrap();
        let n: i64 = c1
            .query_one(
                &format!("SELECT \"{schema}\".sweep(100000, 86400000000, 1000)"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(n >= 1, "the sweep deleted {n}");
        let c2 = raw().await;
        let other = OwnerToken::random();
        let raw_waiting = tokio::spawn({
            let (schema, name) = (schema.clone(), name.clone());
            async move {
                c2.batch_execute("BEGIN").await.unwrap();
                let t = raw_take(&c2, &schema, &name, &other, 30_000_000).await;
                (c2, t)
            }
        });
        let bo = OwnerToken::random();
        let waiting = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move {
                b.try_acquire(&name, bo.step(), Duration::from_secs(30))
                    .await
                    .unwrap()
            }
        });
        wait_blocked(&schema, 2).await;
        c1.batch_execute("COMMIT").await.unwrap();
        let (c2, t_raw) = raw_waiting.await.unwrap();
        let r = waiting.await.unwrap();
        // The raw take ran on a snapshot with the row: it grants nothing.
        let tb = granted(r);
        assert!(tb > tx, "{tb:?} after a swept {tx:?}");
        assert_eq!(t_raw, None, "a take of a deleted version granted {t_raw:?}");
        c2.batch_execute("COMMIT").await.unwrap();
        let h = Lock::inspect(&*b, &name).await.unwrap().holders;
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].owner, bo);
        assert_eq!(
            psql(&format!(
                "SELECT count(*) FROM \"{schema}\".claims WHERE name = '{name}'"
            )),
            "1"
        );
    }
}
