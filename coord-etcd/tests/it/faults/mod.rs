//! The fault suite on etcd (docs/guarantees.md §7): the store-independent lock
//! workload of `conformance::faults` against real etcd servers while real
//! faults are injected: a client cut off by a TCP proxy (also while it
//! holds the lock), the server frozen with `SIGSTOP`, killed with `SIGKILL`
//! and restarted on its data, a 3-node cluster losing its leader (killed,
//! or frozen) or a follower, a 3-node cluster with one member (a follower,
//! or the leader) cut off from the others on the network (network
//! namespaces; needs root), compactions while waiters watch, and a client
//! PROCESS frozen past its TTL while it holds the lock. Each scenario
//! asserts 0 violations of the history checker and that the workload (and
//! every client) progresses within TTL + a stated bound after the fault
//! heals; each prints a `FAULTS ...` line for `scripts/faults`.
//!
//! Also: a retried grant is on a live lease, and the limiter recovers
//! after a long pause.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use coord_core::{Algorithm, Attempt, Limiter, Lock, OwnerToken, Quota};
use coord_etcd::{EtcdBackend, EtcdOptions};
use tokio::time::{Instant, sleep};

mod cluster;
mod common;
mod partition;
mod process;
mod single;
mod workloads;

async fn fast_backend(server: &EtcdServer) -> Arc<EtcdBackend> {
    let url = format!("{}?timeout_ms=500", server.url());
    EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .unwrap()
}

async fn pause(server: &Arc<EtcdServer>, d: Duration) {
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.pause())
        .await
        .unwrap();
    sleep(d).await;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.resume())
        .await
        .unwrap();
}

/// Whenever a same-owner retry is granted, the key it reports is on a
/// live lease with the rest of the grant's TTL ahead of it, even right
/// after a pause longer than the TTL.
///
/// A grant is valid until its attempt's start + TTL (the lease was
/// refreshed, or granted, after that start). Only a read answered before
/// that deadline must find the key: a grant served just before the
/// `SIGSTOP` took effect has its check answered after the pause, when its
/// TTL has legitimately run out and etcd has revoked the lease (seen under
/// load: attempt began 4 ms after the pause was ordered, granted at 7 ms,
/// the read answered at 4022 ms). Such a check is counted as inconclusive,
/// and the loop runs until `CHECKS` conclusive checks of attempts begun
/// after the resume (bounded), so the test does not depend on load.
///
/// This checks the lease-per-claim invariant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_grant_is_on_a_live_lease() {
    const CHECKS: u64 = 20;
    let server = Arc::new(EtcdServer::start());
    let b = fast_backend(&server).await;
    let ttl = b.capabilities().min_ttl.max(Duration::from_secs(1)) * 2;
    let name = "retried";
    let o = OwnerToken::random();
    assert!(matches!(
        b.try_acquire(name, o.step(), ttl).await.unwrap(),
        Attempt::Granted(_)
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let resumed: Arc<std::sync::OnceLock<Instant>> = Default::default();
    // (grants, inconclusive checks, conclusive checks of attempts begun
    // after the resume)
    let counts: Arc<[AtomicU64; 3]> = Default::default();
    let retry = {
        let (b, stop, resumed, counts) = (b.clone(), stop.clone(), resumed.clone(), counts.clone());
        let endpoint = server.endpoint();
        tokio::spawn(async move {
            let mut raw = etcd_client::Client::connect([endpoint], None)
                .await
                .unwrap();
            // Claim keys are named by their lease; the owner's hex
            // begins the value.
            let queue = format!("coord:lock/{name}/");
            let hex = o.to_hex().into_bytes();
            while !stop.load(Ordering::SeqCst) {
                let began = Instant::now();
                if let Ok(Attempt::Granted(_)) = b.try_acquire(name, o.step(), ttl).await {
                    counts[0].fetch_add(1, Ordering::SeqCst);
                    let deadline = began + ttl;
                    let kv = raw
                        .get(
                            queue.clone(),
                            Some(etcd_client::GetOptions::new().with_prefix()),
                        )
                        .await
                        .unwrap();
                    let kv = kv.kvs().iter().find(|kv| kv.value() == hex).cloned();
                    let left = match kv {
                        Some(kv) => Some((
                            kv.lease(),
                            raw.lease_time_to_live(kv.lease(), None).await.unwrap(),
                        )),
                        None => None,
                    };
                    let answered = Instant::now();
                    if answered >= deadline {
                        counts[1].fetch_add(1, Ordering::SeqCst);
                    } else {
                        let Some((lease, left)) = left else {
                            panic!(
                                "granted, but the key is gone {:?} before the grant's deadline",
                                deadline - answered
                            );
                        };
                        // etcd reports the remaining time truncated to whole
                        // seconds, and the lease lives at least until the
                        // deadline: reported > (deadline - answered) - 1 s.
                        let need = (deadline - answered).as_secs_f64() - 1.0;
                        assert!(
                            left.ttl() as f64 > need,
                            "granted on lease {lease} with {} s left, {:?} before the grant's \
                             deadline (TTL {ttl:?})",
                            left.ttl(),
                            deadline - answered
                        );
                        if resumed.get().is_some_and(|r| began >= *r) {
                            counts[2].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
                sleep(Duration::from_millis(50)).await;
            }
        })
    };
    sleep(Duration::from_millis(300)).await;
    pause(&server, ttl + Duration::from_secs(2)).await;
    resumed.set(Instant::now()).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while counts[2].load(Ordering::SeqCst) < CHECKS && !retry.is_finished() {
        assert!(
            Instant::now() < until,
            "only {} conclusive checks after the resume within 60 s",
            counts[2].load(Ordering::SeqCst)
        );
        sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    retry.await.expect("the retry loop found a bad grant");
    let [g, i, c] = counts.as_ref().each_ref().map(|a| a.load(Ordering::SeqCst));
    eprintln!(
        "{g} grants, {i} checks inconclusive (answered after the deadline), {c} conclusive after the resume"
    );
    let _ = b.release(name, o.step()).await;
}

/// After a pause longer than any lease the limiter uses, checks recover
/// by themselves, even under steady traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_recovers_after_a_long_pause() {
    let server = Arc::new(EtcdServer::start());
    let b = fast_backend(&server).await;
    let q = Quota::new(1_000_000, Duration::from_secs(1), Algorithm::FixedWindow);
    b.check("steady", &q, 1).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let last_err: Arc<std::sync::Mutex<Option<(Instant, String)>>> = Default::default();
    // Open-loop traffic (a check every 2 ms, whether or not the earlier
    // ones were answered), so the batch of pending checks never drains.
    let driver = {
        let (b, stop, last_err) = (b.clone(), stop.clone(), last_err.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let (b, last_err) = (b.clone(), last_err.clone());
                tokio::spawn(async move {
                    if let Err(e) = b.check("steady", &q, 1).await {
                        *last_err.lock().unwrap() = Some((Instant::now(), e.to_string()));
                    }
                });
                sleep(Duration::from_millis(2)).await;
            }
        })
    };
    sleep(Duration::from_millis(300)).await;
    pause(&server, Duration::from_secs(5)).await;
    // Whatever lease the state was on is gone now, as after a partition
    // longer than its TTL (etcd may still honour a keepalive that was
    // waiting in a socket buffer; revoking them all leaves no doubt).
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    for l in raw.leases().await.unwrap().leases() {
        let _ = raw.lease_revoke(l.id()).await;
    }
    let resumed = Instant::now();
    sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::SeqCst);
    driver.await.unwrap();
    sleep(Duration::from_secs(2)).await;
    if let Some((at, e)) = last_err.lock().unwrap().clone() {
        assert!(
            at < resumed + Duration::from_secs(3),
            "checks still failed {:?} after the pause ended: {e}",
            at - resumed
        );
    }
    b.check("steady", &q, 1).await.unwrap();
}
