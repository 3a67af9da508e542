//! What coord records through the `metrics` facade (the code lives in
//! coord-core; the in-memory store drives it here), read back from
//! `metrics-util`'s debugging recorder.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use metrics_util::CompositeKey;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

type Entry = (
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
);

fn find<'a>(snap: &'a [Entry], name: &str, labels: &[(&str, &str)]) -> Option<&'a DebugValue> {
    snap.iter()
        .find(|(k, _, _, _)| {
            k.key().name() == name
                && labels.iter().all(|(l, v)| {
                    k.key()
                        .labels()
                        .any(|lab| lab.key() == *l && lab.value() == *v)
                })
        })
        .map(|(_, _, _, v)| v)
}

fn counter(snap: &[Entry], name: &str, labels: &[(&str, &str)]) -> u64 {
    match find(snap, name, labels) {
        Some(DebugValue::Counter(n)) => *n,
        None => 0,
        Some(other) => panic!("{name} is not a counter: {other:?}"),
    }
}

fn samples(snap: &[Entry], name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match find(snap, name, labels) {
        Some(DebugValue::Histogram(v)) => v.iter().map(|f| f.into_inner()).collect(),
        None => Vec::new(),
        Some(other) => panic!("{name} is not a histogram: {other:?}"),
    }
}

/// Run `f` on a current-thread runtime with a fresh recorder installed for
/// this thread (tasks spawned by coord run on it too), then snapshot.
fn recorded<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> Vec<Entry> {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    run_recorded(&recorder, f);
    snapshotter.snapshot().into_vec()
}

/// [`recorded`] on a runtime whose clock starts paused (it moves only
/// when every task waits): timers fire in order however loaded the
/// machine.
fn recorded_paused<F: std::future::Future<Output = ()>>(f: impl FnOnce() -> F) -> Vec<Entry> {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
            .block_on(f())
    });
    snapshotter.snapshot().into_vec()
}

/// Run `f` on a current-thread runtime with `recorder` installed for this
/// thread (tasks spawned by coord run on it too).
fn run_recorded<F: std::future::Future<Output = ()>>(
    recorder: &DebuggingRecorder,
    f: impl FnOnce() -> F,
) {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f())
    });
}

/// The value of gauge `name` with `labels` in `snap` (0 when never set).
fn gauge(snap: &[Entry], name: &str, labels: &[(&str, &str)]) -> f64 {
    match find(snap, name, labels) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        None => 0.0,
        Some(other) => panic!("{name} is not a gauge: {other:?}"),
    }
}

const LOCK: [(&str, &str); 2] = [("store", "memory"), ("kind", "lock")];

#[test]
fn acquires_waits_handoffs_holds_and_timeouts_are_recorded() {
    let snap = recorded(|| async {
        let coord = coord_memory::connect("memory://metrics-acquire").unwrap();
        let locks = coord.locks().unwrap();
        let ttl = Duration::from_secs(10);
        let first = locks.try_acquire("m", ttl).await.unwrap().unwrap();
        // Busy: a try and a short wait time out.
        assert!(locks.try_acquire("m", ttl).await.unwrap().is_none());
        assert!(
            locks
                .acquire("m", ttl, Duration::from_millis(20))
                .await
                .is_err()
        );
        // A waiter is handed the lock on release.
        let l2 = locks.clone();
        let waiter =
            tokio::spawn(async move { l2.acquire("m", ttl, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        first.release().await.unwrap();
        let second = waiter.await.unwrap().unwrap();
        drop(second); // released on drop, in the background
        tokio::time::sleep(Duration::from_millis(20)).await;
    });
    let ok = |o| [LOCK[0], LOCK[1], ("outcome", o)];
    assert_eq!(counter(&snap, "coord_acquire_total", &ok("granted")), 2);
    assert_eq!(counter(&snap, "coord_acquire_total", &ok("timeout")), 2);
    assert_eq!(counter(&snap, "coord_acquire_total", &ok("error")), 0);
    assert_eq!(counter(&snap, "coord_handoffs_total", &LOCK), 1);
    let waits = samples(&snap, "coord_acquire_wait_seconds", &LOCK);
    assert_eq!(waits.len(), 2);
    assert!(
        waits.iter().any(|w| *w >= 0.04),
        "the handed-off wait: {waits:?}"
    );
    let holds = samples(&snap, "coord_hold_seconds", &LOCK);
    assert_eq!(
        holds.len(),
        2,
        "explicit release and release on drop: {holds:?}"
    );
    assert!(holds.iter().any(|h| *h >= 0.04), "{holds:?}");
}

#[test]
fn watchdog_renewals_and_lost_ownership_are_recorded() {
    // A paused clock: a renewal every third of the 300 ms TTL comes in
    // time, never late on a loaded machine.
    let snap = recorded_paused(|| async {
        let coord = coord_memory::connect("memory://metrics-lost").unwrap();
        let locks = coord.locks().unwrap();
        let ttl = Duration::from_millis(300);
        let mut g = locks.try_acquire("w", ttl).await.unwrap().unwrap();
        g.keep_alive();
        tokio::time::sleep(Duration::from_millis(450)).await; // two renewals
        assert!(locks.force_release("w").await.unwrap());
        tokio::time::timeout(Duration::from_secs(2), g.lost())
            .await
            .expect("lost fires");
    });
    let ok = [LOCK[0], LOCK[1], ("outcome", "ok")];
    let failed = [LOCK[0], LOCK[1], ("outcome", "failed")];
    assert!(counter(&snap, "coord_watchdog_renewals_total", &ok) >= 2);
    assert_eq!(counter(&snap, "coord_watchdog_renewals_total", &failed), 1);
    assert_eq!(counter(&snap, "coord_lost_total", &LOCK), 1);
}

#[test]
fn limiter_admits_and_denials_are_recorded() {
    let snap = recorded(|| async {
        let coord = coord_memory::connect("memory://metrics-limit").unwrap();
        let limiter = coord.limiter().unwrap();
        let q = coord_core::Quota::new(2, Duration::from_secs(60), coord_core::Algorithm::Gcra);
        for _ in 0..3 {
            limiter.check("k", q).await.unwrap();
        }
    });
    let m = "coord_limiter_checks_total";
    assert_eq!(
        counter(&snap, m, &[("store", "memory"), ("outcome", "allowed")]),
        2
    );
    assert_eq!(
        counter(&snap, m, &[("store", "memory"), ("outcome", "denied")]),
        1
    );
}

#[test]
fn leases_and_leaderships_carry_their_kind() {
    let snap = recorded(|| async {
        let coord = coord_memory::connect("memory://metrics-kinds").unwrap();
        let lease = coord
            .leases()
            .unwrap()
            .grant("l", Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        lease.revoke().await.unwrap();
        let l = coord
            .elections()
            .unwrap()
            .campaign("e", "me", Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap();
        l.resign().await.unwrap();
    });
    for kind in ["lease", "leadership"] {
        let labels = [("store", "memory"), ("kind", kind), ("outcome", "granted")];
        assert_eq!(counter(&snap, "coord_acquire_total", &labels), 1, "{kind}");
        let held = [("store", "memory"), ("kind", kind)];
        assert_eq!(
            samples(&snap, "coord_hold_seconds", &held).len(),
            1,
            "{kind}"
        );
    }
}

/// Queue pushes, deliveries, acks and nacks are counted by `op`; a
/// delivery's hold time and its lost ownership carry `kind=delivery`.
#[test]
fn queue_operations_are_recorded() {
    let snap = recorded(|| async {
        let coord = coord_memory::MemoryBackend::coord();
        let q = coord.queues().unwrap();
        for _ in 0..3 {
            q.push("jobs", b"x").await.unwrap();
        }
        let d = q
            .pop("jobs", Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        d.ack().await.unwrap();
        let d = q
            .pop("jobs", Duration::from_secs(5), Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        d.nack(Duration::ZERO).await.unwrap();
        // A delivery whose visibility lapses under it is lost.
        let d = q
            .pop("jobs", Duration::from_millis(30), Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        d.lost().await;
        // The lost signal fires at the local deadline, a drift margin
        // before the store's; past that the ack is refused.
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(d.ack().await.is_err());
    });
    let ops = |op| {
        counter(
            &snap,
            "coord_queue_ops_total",
            &[("store", "memory"), ("op", op)],
        )
    };
    assert_eq!(
        (ops("push"), ops("deliver"), ops("ack"), ops("nack")),
        (3, 3, 1, 1)
    );
    assert_eq!(
        counter(
            &snap,
            "coord_lost_total",
            &[("store", "memory"), ("kind", "delivery")]
        ),
        1
    );
    assert_eq!(
        samples(&snap, "coord_hold_seconds", &[("kind", "delivery")]).len(),
        3
    );
}

/// `coord_held` counts the claims this process holds (up at a grant, down
/// at a release, a release on drop, and lost ownership), `coord_waiting`
/// the acquires and pops waiting now; a delivery dropped unacked is
/// counted as given back; `stats` sets a queue's gauges.
#[test]
fn held_and_waiting_gauges_follow_claims_waiters_and_queues() {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    // Each snapshot hands out a gauge's change since the last one (a set
    // value, for a gauge set since): the running totals of every gauge,
    // and the values of the last snapshot.
    let totals: RefCell<HashMap<CompositeKey, f64>> = RefCell::default();
    let last: RefCell<Vec<Entry>> = RefCell::default();
    let snap = || {
        let snap = snapshotter.snapshot().into_vec();
        let mut t = totals.borrow_mut();
        for (k, _, _, v) in &snap {
            match v {
                DebugValue::Gauge(g) => *t.entry(k.clone()).or_default() += g.into_inner(),
                DebugValue::Counter(n) => *t.entry(k.clone()).or_default() += *n as f64,
                DebugValue::Histogram(_) => {}
            }
        }
        *last.borrow_mut() = snap;
    };
    // A counted gauge's value now (`coord_held`, `coord_waiting`), or a
    // counter's total.
    let now = |name: &str, labels: &[(&str, &str)]| {
        snap();
        let t = totals.borrow();
        let entries: Vec<Entry> = t
            .iter()
            .map(|(k, v)| (k.clone(), None, None, DebugValue::Gauge((*v).into())))
            .collect();
        gauge(&entries, name, labels)
    };
    let (held, waiting) = ("coord_held", "coord_waiting");
    let kind = |k| [("store", "memory"), ("kind", k)];
    run_recorded(&recorder, || async {
        let coord = coord_memory::connect("memory://metrics-gauges").unwrap();
        let locks = coord.locks().unwrap();
        let ttl = Duration::from_secs(10);
        let first = locks.try_acquire("g", ttl).await.unwrap().unwrap();
        assert_eq!(now(held, &LOCK), 1.0);
        let l2 = locks.clone();
        let waiter =
            tokio::spawn(async move { l2.acquire("g", ttl, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(now(waiting, &LOCK), 1.0, "one acquire waits");
        first.release().await.unwrap();
        let second = waiter.await.unwrap().unwrap();
        assert_eq!((now(held, &LOCK), now(waiting, &LOCK)), (1.0, 0.0));
        drop(second); // released on drop, in the background
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(now(held, &LOCK), 0.0, "released on drop");

        // Lost ownership counts down at once, before the guard goes.
        let g = locks.try_acquire("g", ttl).await.unwrap().unwrap();
        assert!(locks.force_release("g").await.unwrap());
        assert!(g.extend(ttl).await.is_err());
        assert_eq!(now(held, &LOCK), 0.0, "lost");
        drop(g);
        assert_eq!(now(held, &LOCK), 0.0, "counted down once");

        let p = coord
            .semaphores()
            .unwrap()
            .try_acquire("s", 2, ttl)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(now(held, &kind("permit")), 1.0);
        p.release().await.unwrap();
        assert_eq!(now(held, &kind("permit")), 0.0);

        let q = coord.queues().unwrap();
        for _ in 0..3 {
            q.push("jobs", b"x").await.unwrap();
        }
        let d = q.pop("jobs", ttl, Duration::ZERO).await.unwrap().unwrap();
        assert_eq!(now(held, &kind("delivery")), 1.0);
        let s = q.stats("jobs").await.unwrap();
        assert_eq!((s.ready, s.in_flight), (2, 1));
        // The queue's gauges as the last snapshot has them (set by
        // `stats` since the one before).
        let read = |state| {
            let labels = [("store", "memory"), ("queue", "jobs"), ("state", state)];
            gauge(&last.borrow(), "coord_queue_messages", &labels)
        };
        snap();
        assert_eq!(
            (read("ready"), read("in_flight"), read("dead")),
            (2.0, 1.0, 0.0)
        );
        drop(d); // given back, in the background
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(now(held, &kind("delivery")), 0.0);
        q.stats("jobs").await.unwrap();
        snap();
        assert_eq!((read("ready"), read("in_flight")), (3.0, 0.0));

        let q2 = q.clone();
        let pop = tokio::spawn(async move { q2.pop("empty", ttl, Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(now(waiting, &kind("delivery")), 1.0, "a blocked pop");
        q.push("empty", b"y").await.unwrap();
        let d = pop.await.unwrap().unwrap().unwrap();
        assert_eq!(now(waiting, &kind("delivery")), 0.0);
        d.ack().await.unwrap();
    });
    let give_backs = now(
        "coord_queue_ops_total",
        &[("store", "memory"), ("op", "give_back")],
    );
    assert_eq!(give_backs, 1.0, "the dropped delivery was given back");
}
