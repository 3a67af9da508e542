//! Lock cases of many at once: several names in any order, many clients on one name.

use super::LONG;
use crate::{Factory, unique};
use coord_core::{FencedRegister, FencingToken, LockOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::timeout;

/// `acquire_all` from two clients with reversed name lists never deadlocks.
pub async fn lock_acquire_all_reversed_orders_never_deadlock(f: &Factory) {
    let base = unique("transfer");
    let names: Vec<String> = (0..3).map(|i| format!("{base}-account-{i}")).collect();
    let mut tasks = Vec::new();
    for reversed in [false, true] {
        let c = f.client().await;
        let mut ns = names.clone();
        if reversed {
            ns.reverse();
        }
        ns.push(ns[0].clone()); // duplicates are fine
        tasks.push(tokio::spawn(async move {
            let locks = c.locks().unwrap();
            for _ in 0..10 {
                let all = locks
                    .acquire_all(&ns, LockOptions::new(LONG).wait(Duration::from_secs(20)))
                    .await
                    .expect("acquire_all deadlocked or failed");
                assert_eq!(all.guards().len(), 3);
                tokio::task::yield_now().await;
                all.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(60), t)
            .await
            .expect("deadlock")
            .unwrap();
    }
}

/// 16 clients x 100 acquisitions of one name, each doing a
/// read-modify-write on a shared value and a write to a fenced register:
/// the value is exact, tokens strictly increase in grant order, the
/// register never accepts a stale token.
pub async fn lock_mutual_exclusion_under_load(f: &Factory) {
    const CLIENTS: usize = 16;
    const ROUNDS: u64 = 100;
    let name = unique("load");
    let value = Arc::new(AtomicU64::new(0));
    let register = Arc::new(FencedRegister::new(0u64));
    let order = Arc::new(std::sync::Mutex::new(Vec::<FencingToken>::new()));
    let inside = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = f.client().await;
        let (name, value, register, order, inside) = (
            name.clone(),
            value.clone(),
            register.clone(),
            order.clone(),
            inside.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let locks = c.locks().unwrap();
            for _ in 0..ROUNDS {
                let g = locks
                    .acquire(&name, LONG, Duration::from_secs(120))
                    .await
                    .expect("acquire under load");
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                let v = value.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                value.store(v + 1, Ordering::SeqCst);
                assert!(
                    register.write(g.fencing_token(), v + 1),
                    "the register rejected the current holder"
                );
                order.lock().unwrap().push(g.fencing_token());
                inside.store(false, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        value.load(Ordering::SeqCst),
        CLIENTS as u64 * ROUNDS,
        "lost updates"
    );
    let order = order.lock().unwrap();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order"
    );
    assert!(
        !register.write(order[0], 0),
        "the register accepted a stale token"
    );
}
