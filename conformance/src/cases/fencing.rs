//! Fencing source cases.

use std::collections::HashSet;

use coord_core::FencingToken;

use crate::{Factory, unique};

/// `next` is strictly increasing per client and unique across 16
/// concurrent clients.
pub async fn fencing_next_is_unique_and_increasing_under_concurrency(f: &Factory) {
    let resource = unique("fence");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let c = f.client().await;
        let r = resource.clone();
        tasks.push(tokio::spawn(async move {
            let fencing = c.fencing().unwrap();
            let mut seen = Vec::new();
            for _ in 0..25 {
                seen.push(fencing.next(&r).await.unwrap());
            }
            seen
        }));
    }
    let mut all = HashSet::new();
    for t in tasks {
        let seen = t.await.unwrap();
        assert!(
            seen.windows(2).all(|w| w[0] < w[1]),
            "tokens went back within one client: {seen:?}"
        );
        for s in seen {
            assert!(all.insert(s), "token {s} handed out twice");
        }
    }
    assert_eq!(all.len(), 16 * 25);
}

/// Resources are independent: each keeps rising whatever the others do.
pub async fn fencing_resources_are_independent(f: &Factory) {
    let (a, b) = (f.client().await, f.client().await);
    let (r1, r2) = (unique("fence-a"), unique("fence-b"));
    let mut last1 = FencingToken(0);
    let mut last2 = FencingToken(0);
    for i in 0..20 {
        let c = if i % 2 == 0 { &a } else { &b };
        let t1 = c.fencing().unwrap().next(&r1).await.unwrap();
        assert!(t1 > last1, "{r1}: {t1} after {last1}");
        last1 = t1;
        if i % 3 == 0 {
            let t2 = c.fencing().unwrap().next(&r2).await.unwrap();
            assert!(t2 > last2, "{r2}: {t2} after {last2}");
            last2 = t2;
        }
    }
}
