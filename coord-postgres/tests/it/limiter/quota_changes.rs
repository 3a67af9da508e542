//! Quota changes carry the state over: alternating quotas admit at most
//! the larger limit, a smaller quota after use denies, and a window
//! change carries the count over.

use std::time::Duration;

use coord_core::{Limiter, Quota};

use super::{ALL, away_from_a_600s_boundary, backend, quota, unique};

/// 1000 checks alternating 10/600s and 11/600s admit at most 11 in total,
/// for every algorithm: a quota change never grants a fresh allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternating_quotas_admit_at_most_the_larger_limit() {
    let b = backend(2).await;
    away_from_a_600s_boundary().await;
    for algorithm in ALL {
        let key = unique("alternate");
        let mut admitted = 0;
        for i in 0..1000 {
            let q = quota(algorithm, if i % 2 == 0 { 10 } else { 11 });
            if b.check(&key, &q, 1).await.unwrap().allowed {
                admitted += 1;
            }
        }
        assert!(
            (10..=11).contains(&admitted),
            "{algorithm:?}: {admitted} admitted alternating 10/600s and 11/600s"
        );
    }
}

/// 15 admitted under 20/600s; then a check under 10/600s is denied, for
/// every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_quota_after_use_denies() {
    let b = backend(2).await;
    away_from_a_600s_boundary().await;
    for algorithm in ALL {
        let key = unique("shrink");
        for i in 0..15 {
            let d = b.check(&key, &quota(algorithm, 20), 1).await.unwrap();
            assert!(d.allowed, "{algorithm:?}: check {i} under 20/600s denied");
        }
        let d = b.check(&key, &quota(algorithm, 10), 1).await.unwrap();
        assert!(
            !d.allowed,
            "{algorithm:?}: 15 used under 20/600s, then 10/600s admitted: {d:?}"
        );
    }
}

/// A window change: 5 admitted under 10/600s, then under 10/60s the
/// estimate carries over (at most 5 more), for every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_change_carries_the_count_over() {
    let b = backend(2).await;
    away_from_a_600s_boundary().await;
    for algorithm in ALL {
        let key = unique("rewindow");
        for _ in 0..5 {
            assert!(
                b.check(&key, &quota(algorithm, 10), 1)
                    .await
                    .unwrap()
                    .allowed
            );
        }
        let short = Quota::new(10, Duration::from_secs(60), algorithm);
        let mut more = 0;
        for _ in 0..20 {
            if b.check(&key, &short, 1).await.unwrap().allowed {
                more += 1;
            }
        }
        assert!(
            more <= 5,
            "{algorithm:?}: 5 used under 10/600s, then {more} more under 10/60s"
        );
    }
}
