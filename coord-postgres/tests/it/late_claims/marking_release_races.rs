//! A late attempt racing the release that marks its owner, decided by the
//! row lock: an attempt waiting for the marking release takes nothing, and
//! a release waiting for the late grant frees it.

use crate::support;
use std::sync::Arc;

use coord_core::{Attempt, Lock, OwnerToken};
use coord_postgres::PostgresBackend;
use support::{LONG, direct, raw, unique, wait_blocked};

use super::{SERIAL, attempt, cycle, leave, row};

/// A stamp 10 s after now: every attempt the test's client sends in the
/// next seconds is stamped before it.
fn future_stamp() -> i64 {
    coord_core::late::stamp() + 10_000_000
}

/// The release that marks an owner holds the row lock (its transaction
/// is kept open) while that owner's late attempt arrives: the attempt
/// waits, then re-reads the row with the mark and takes nothing, on a
/// name whose row exists (the common statement's in-place update) and on
/// a name with no row (the release inserts one; the attempt's insert waits
/// for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_attempt_waiting_for_the_marking_release_takes_nothing() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_race");
    let b: Arc<PostgresBackend> = direct(&schema).await;
    for fresh in [false, true] {
        let name = unique("race");
        if !fresh {
            // The name's row exists and is free.
            cycle(&b, &name).await;
        }
        let owner = OwnerToken::random();
        let tx = raw().await;
        tx.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            leave(&tx, &schema, &name, &owner, future_stamp()).await,
            (false, false)
        );
        let late = tokio::spawn({
            let (b, name) = (b.clone(), name.clone());
            async move { Lock::try_acquire(&*b, &name, owner.step(), LONG).await }
        });
        wait_blocked(&schema, 1).await;
        tx.batch_execute("COMMIT").await.unwrap();
        let got = late.await.unwrap().unwrap();
        assert!(
            matches!(got, Attempt::Held { .. }),
            "fresh name {fresh}: the late attempt that waited for the marking release got {got:?}"
        );
        assert_eq!(
            row(&b, "lock", &name).await,
            Some((false, 1)),
            "fresh {fresh}"
        );
        // Another owner is not refused.
        cycle(&b, &name).await;
    }
}

/// The other order: the late attempt's grant holds the row lock (its
/// transaction is kept open) when the release that marks its owner
/// arrives. The release waits, then frees the grant (and marks the owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_the_late_grant_frees_it() {
    let _serial = SERIAL.lock().await;
    let schema = unique("late_race2");
    let b = direct(&schema).await;
    for fresh in [false, true] {
        let name = unique("race2");
        if !fresh {
            cycle(&b, &name).await;
        }
        let owner = OwnerToken::random();
        let tx = raw().await;
        tx.batch_execute("BEGIN").await.unwrap();
        assert!(
            attempt(&tx, &schema, &name, &owner, Some(1))
                .await
                .is_some()
        );
        let marker = raw().await;
        let release = tokio::spawn({
            let (schema, name) = (schema.clone(), name.clone());
            async move { leave(&marker, &schema, &name, &owner, future_stamp()).await }
        });
        wait_blocked(&schema, 1).await;
        tx.batch_execute("COMMIT").await.unwrap();
        assert_eq!(
            release.await.unwrap(),
            (true, false),
            "fresh name {fresh}: the release freed the live grant it waited for"
        );
        assert_eq!(
            row(&b, "lock", &name).await,
            Some((false, 1)),
            "fresh {fresh}"
        );
        cycle(&b, &name).await;
    }
}
