//! Bounded state: the state of a name idle past its TTL, window or grace
//! costs nothing in etcd, even while the client process lives on.
//!
//! Each test touches many distinct names on a private etcd: locks (half
//! released, half abandoned without a release), named leases (abandoned),
//! limiter keys, fencing resources, and, in smaller numbers, elections
//! (abandoned leaderships), completed barrier generations, barriers whose
//! only participant timed out, and barriers whose participant "crashed"
//! after arriving (it never waits nor withdraws). Then it lets the TTLs,
//! windows and graces pass, with the same client still connected, and
//! counts what is left: the keys under coord's prefix must be back within
//! 1 % of the names touched, and the leases few.
//!
//! - `bounded_state_after_idle_names` (CI): 2,000 names of each kind, 100
//!   elections and barriers of each kind; about a minute, most of it the
//!   barrier grace (30 s) and the limiter leases' life.
//! - `bounded_state_after_idle_names_100k` (`#[ignore]`, run with
//!   `cargo test -p coord-etcd --test it -- --ignored soak`): 100,000 names of
//!   each kind, 1,000 elections and barriers of each kind; several minutes.

use std::sync::Arc;
use std::time::Duration;

use conformance::testkit::etcd::EtcdServer;
use coord_core::{Algorithm, Attempt, Barrier, Election, FencingSource, Lease, Limiter, Lock};
use coord_core::{OwnerToken, Quota};
use coord_etcd::{EtcdBackend, EtcdOptions};
use futures::StreamExt;
use tokio::time::{Instant, sleep};

/// Calls in flight at once.
const CONCURRENCY: usize = 32;

/// Run `f(i)` for `0..n`, `CONCURRENCY` at a time.
async fn each<F, Fut>(n: usize, f: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(0..n)
        .map(f)
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

async fn keys_under(raw: &mut etcd_client::Client, prefix: &str) -> i64 {
    raw.get(
        prefix,
        Some(
            etcd_client::GetOptions::new()
                .with_prefix()
                .with_count_only(),
        ),
    )
    .await
    .unwrap()
    .count()
}

async fn leases(raw: &mut etcd_client::Client) -> usize {
    raw.leases().await.unwrap().leases().len()
}

async fn soak(names: usize, few: usize) {
    let server = EtcdServer::start();
    let b: Arc<EtcdBackend> = EtcdBackend::connect(EtcdOptions::parse(&server.url()).unwrap())
        .await
        .unwrap();
    let coord = b.coord();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    // Let the connect's lease go.
    sleep(Duration::from_millis(500)).await;
    let base_keys = keys_under(&mut raw, "coord:").await;
    let base_leases = leases(&mut raw).await;
    let ttl = Duration::from_secs(2);
    let t0 = Instant::now();

    // Locks: even names released, odd ones abandoned (the raw trait: no
    // guard, no release; the server expires them at their TTL).
    each(names, |i| {
        let b = b.clone();
        async move {
            let (name, o) = (format!("soak-lock-{i}"), OwnerToken::random());
            let a = b.try_acquire(&name, o.step(), ttl).await.unwrap();
            assert!(matches!(a, Attempt::Granted(_)), "{a:?}");
            if i % 2 == 0 {
                assert!(b.release(&name, o.step()).await.unwrap());
            }
        }
    })
    .await;
    // Named leases, abandoned.
    each(names, |i| {
        let b = b.clone();
        async move {
            let a = Lease::grant(
                &*b,
                &format!("soak-lease-{i}"),
                OwnerToken::random().step(),
                ttl,
            )
            .await
            .unwrap();
            assert!(matches!(a, Attempt::Granted(_)), "{a:?}");
        }
    })
    .await;
    // Limiter keys: a 1 s window, every algorithm.
    each(names, |i| {
        let b = b.clone();
        async move {
            let alg = Algorithm::ALL[i % Algorithm::ALL.len()];
            let q = Quota::new(10, Duration::from_secs(1), alg);
            let d = b.check(&format!("soak-limit-{i}"), &q, 1).await.unwrap();
            assert!(d.allowed);
        }
    })
    .await;
    // Fencing resources.
    let mut last = 0;
    for chunk in 0..names.div_ceil(1000) {
        let tokens: Vec<u64> = futures::stream::iter(chunk * 1000..((chunk + 1) * 1000).min(names))
            .map(|i| {
                let b = b.clone();
                async move { b.next(&format!("soak-fence-{i}")).await.unwrap().get() }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let max = tokens.iter().copied().max().unwrap_or(0);
        assert!(max > last);
        last = max;
    }
    // Elections: leaderships abandoned.
    each(few, |i| {
        let b = b.clone();
        async move {
            let a = b
                .try_campaign(
                    &format!("soak-elect-{i}"),
                    "c",
                    OwnerToken::random().step(),
                    ttl,
                )
                .await
                .unwrap();
            assert!(matches!(a, Attempt::Granted(_)));
        }
    })
    .await;
    // Barriers: completed generations, a participant that timed out, and
    // one that arrived and "crashed" (never waits, never withdraws).
    let barriers = coord.barriers().unwrap();
    each(few, |i| {
        let (barriers, b) = (barriers.clone(), b.clone());
        async move {
            let name = format!("soak-barrier-{i}");
            let (x, y) = tokio::join!(
                barriers.wait(&name, 2, "x", Duration::from_secs(10)),
                barriers.wait(&name, 2, "y", Duration::from_secs(10)),
            );
            assert_eq!(x.unwrap(), y.unwrap());
            let alone = format!("soak-barrier-alone-{i}");
            assert!(
                barriers
                    .wait(&alone, 2, "x", Duration::from_millis(50))
                    .await
                    .is_err()
            );
            let crashed = format!("soak-barrier-crashed-{i}");
            let a = b
                .arrive(&crashed, 2, "x", &OwnerToken::random())
                .await
                .unwrap();
            assert!(!a.complete);
        }
    })
    .await;
    let touched = 4 * names + 4 * few;
    let written = t0.elapsed();
    let peak_keys = keys_under(&mut raw, "coord:").await - base_keys;
    let peak_leases = leases(&mut raw).await;
    eprintln!("touched {touched} names in {written:?}: {peak_keys} keys, {peak_leases} leases");

    // Longest documented life of idle state: the barrier grace (30 s) after
    // the last write, the limiter leases' (2 x retention + call timeout +
    // 2 s, used while 1 retention + 1 call timeout is left), claim TTLs;
    // plus etcd's expiry lag and margin for a loaded machine.
    let bound = Instant::now() + Duration::from_secs(40);
    let allowed = (touched / 100) as i64;
    let (mut keys, mut lease_count);
    loop {
        keys = keys_under(&mut raw, "coord:").await - base_keys;
        lease_count = leases(&mut raw).await;
        if (keys <= allowed && lease_count <= base_leases + 8) || Instant::now() > bound {
            break;
        }
        sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "after {:?} idle: {keys} keys (allowed {allowed}), {lease_count} leases (baseline {base_leases}); total {:?}",
        t0.elapsed() - written,
        t0.elapsed()
    );
    assert!(keys <= allowed, "{keys} keys left of {touched} names");
    assert!(
        lease_count <= base_leases + 8,
        "{lease_count} leases left (baseline {base_leases})"
    );
    // The client still works, and fencing still rises.
    assert!(b.next("soak-fence-0").await.unwrap().get() > last);
    drop(coord);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_state_after_idle_names() {
    soak(2_000, 100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "several minutes: 100,000 names of each kind"]
async fn bounded_state_after_idle_names_100k() {
    soak(100_000, 1_000).await;
}

/// A barrier's state outlives its grace (30 s) while a participant waits:
/// the waiting client keeps its lease alive. The second party arrives
/// after 35 s, from another client, and completes the generation the first
/// one waits in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waited_on_barrier_outlives_its_grace() {
    let server = conformance::testkit::etcd::shared();
    let a = coord_etcd::connect(&server.url()).await.unwrap();
    let b = coord_etcd::connect(&server.url()).await.unwrap();
    let name = "soak-long-wait";
    let waiting = tokio::spawn(async move {
        a.barriers()
            .unwrap()
            .wait(name, 2, "first", Duration::from_secs(60))
            .await
    });
    sleep(Duration::from_secs(35)).await;
    let second = b
        .barriers()
        .unwrap()
        .wait(name, 2, "second", Duration::from_secs(20))
        .await
        .expect("the second arrival completes the generation");
    let first = waiting
        .await
        .unwrap()
        .expect("the first participant is released");
    assert_eq!(first, second, "both in one generation");
}
