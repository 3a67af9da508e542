//! Barriers on the real server: a withdrawal racing the arrival that
//! completes the generation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::postgres::cluster;
use coord_core::Barrier;
use coord_postgres::PostgresBackend;

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

async fn backend(pool: usize) -> Arc<PostgresBackend> {
    coord_postgres::builder(&cluster().url())
        .pool_size(pool)
        .listen(false)
        .connect_backend()
        .await
        .expect("connect to the test cluster")
}

/// One round: `a` has arrived at a barrier of 2; then `b` arrives (which
/// completes the generation unless `a` is gone) while `a` withdraws. With
/// `stall`, another session holds the barrier's row lock while both
/// statements start (`first` goes first), so both wait for it and run on
/// the row as it is after that lock is released. Returns (withdrawn, b's
/// arrival completed the generation).
async fn round(b: &Arc<PostgresBackend>, stall: Option<bool>) -> (bool, bool) {
    let name = unique("withdraw");
    let a_id = coord_core::OwnerToken::random();
    let a = b.arrive(&name, 2, "a", &a_id).await.unwrap();
    assert!(!a.complete);
    let holder = match stall {
        Some(_) => {
            let c = b.pool().get().await.unwrap();
            c.batch_execute("BEGIN").await.unwrap();
            c.execute(
                "SELECT 1 FROM coord.barriers WHERE name = $1 FOR UPDATE",
                &[&name],
            )
            .await
            .unwrap();
            Some(c)
        }
        None => None,
    };
    let arrive = {
        let (b, name) = (b.clone(), name.clone());
        async move {
            b.arrive(&name, 2, "b", &coord_core::OwnerToken::random())
                .await
                .unwrap()
        }
    };
    let withdraw = {
        let (b, name) = (b.clone(), name.clone());
        async move { b.withdraw(&name, a.generation, "a", &a_id).await.unwrap() }
    };
    let (arrival, withdrawn) = match stall {
        None => {
            let x = tokio::spawn(arrive);
            let y = tokio::spawn(withdraw);
            (x.await.unwrap(), y.await.unwrap())
        }
        Some(arrive_first) => {
            let gap = Duration::from_millis(20);
            let (x, y);
            if arrive_first {
                x = tokio::spawn(arrive);
                tokio::time::sleep(gap).await;
                y = tokio::spawn(withdraw);
            } else {
                y = tokio::spawn(withdraw);
                tokio::time::sleep(gap).await;
                x = tokio::spawn(arrive);
            }
            tokio::time::sleep(gap).await;
            holder.unwrap().batch_execute("COMMIT").await.unwrap();
            (x.await.unwrap(), y.await.unwrap())
        }
    };
    let completed = arrival.complete && arrival.generation == a.generation;
    (withdrawn, completed)
}

/// A participant reported withdrawn is never one whose generation
/// completed with it: 40 rounds where both statements wait for another
/// session's row lock (each order), then 200 free-running races.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn withdraw_never_reports_a_completed_participant() {
    let b = backend(8).await;
    let mut seen = [0u32; 4];
    for i in 0..240 {
        let stall = match i {
            0..20 => Some(true),
            20..40 => Some(false),
            _ => None,
        };
        let (withdrawn, completed) = round(&b, stall).await;
        assert!(
            !(withdrawn && completed),
            "round {i} ({stall:?}): `a` was reported withdrawn, but the arrival of `b` completed \
             the generation with it"
        );
        assert!(
            withdrawn || completed,
            "round {i}: `a` neither withdrawn nor passed"
        );
        seen[usize::from(withdrawn) * 2 + usize::from(completed)] += 1;
    }
    eprintln!("(withdrawn, completed) counts [ff, ft, tf, tt]: {seen:?}");
}
