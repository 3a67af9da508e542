//! Wake-ups: how a store's notification (pub/sub message, `NOTIFY`, watch
//! event, in-process signal) reaches the local tasks waiting on a name.
//!
//! A backend owns one [`Wakeups`] registry per client. Waiters call
//! [`Wakeups::subscribe`] before their attempt; the backend's listener calls
//! [`Wakeups::notify_one`] (locks: one waiter per release) or
//! [`Wakeups::notify_all`] (barriers, elections) when the store says a name
//! changed. The core wait loop does the rest.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
pub use tokio::sync::futures::Notified;

/// A per-client registry of local waiters, keyed by name.
///
/// Cheap to clone (an `Arc`). Entries exist only while somebody waits.
#[derive(Clone, Default)]
pub struct Wakeups {
    inner: Arc<Registry>,
}

/// The waiters by key, and how many `Waiter`s are alive (so notifying a
/// name nobody waits on, the common case, takes no lock).
#[derive(Default)]
struct Registry {
    map: Mutex<HashMap<Box<str>, Weak<Notify>>>,
    live: AtomicUsize,
}

impl Registry {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Weak<Notify>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Wakeups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.inner.live.load(Ordering::Relaxed);
        f.debug_struct("Wakeups").field("waiters", &n).finish()
    }
}

impl Wakeups {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register interest in `key`. Keep the [`Waiter`] across attempts and
    /// create its [`Waiter::notified`] future before each attempt, so a
    /// notification that arrives during the attempt is not missed.
    pub fn subscribe(&self, key: &str) -> Waiter {
        let mut map = self.inner.map();
        self.inner.live.fetch_add(1, Ordering::AcqRel);
        if let Some(existing) = map.get(key).and_then(Weak::upgrade) {
            return Waiter {
                notify: existing,
                registry: Some((Arc::downgrade(&self.inner), key.into())),
            };
        }
        let notify = Arc::new(Notify::new());
        map.insert(key.into(), Arc::downgrade(&notify));
        Waiter {
            notify,
            registry: Some((Arc::downgrade(&self.inner), key.into())),
        }
    }

    fn get(&self, key: &str) -> Option<Arc<Notify>> {
        if self.inner.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut map = self.inner.map();
        match map.get(key).map(Weak::upgrade) {
            Some(Some(n)) => Some(n),
            Some(None) => {
                // The last waiter is going away right now; forget the entry.
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Wake one local waiter of `key` (or the next one to wait, if none is
    /// waiting right now). Returns whether anybody is registered.
    pub fn notify_one(&self, key: &str) -> bool {
        match self.get(key) {
            Some(n) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// Wake every local waiter of `key`.
    pub fn notify_all(&self, key: &str) -> bool {
        match self.get(key) {
            Some(n) => {
                n.notify_waiters();
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// Wake the local waiters a store's wake-up payload names (a Redis
    /// `PUBLISH`, a PostgreSQL `NOTIFY`): `<kind>:<name>` is the key
    /// waited on. A lock is granted to one waiter at a time, and a
    /// semaphore payload names one waiting owner
    /// (`semaphore:<owner>:<name>`): one waiter. A work queue's lane,
    /// `queue:<lane>:<name>`, wakes one (one message came) and
    /// `queue-all:<lane>:<name>` every one, of the key
    /// `queue:<lane>:<name>` (a redrive may bring many). Every other
    /// payload wakes every waiter of its key: none is dropped for want of
    /// a line here.
    ///
    /// ```
    /// let w = coord_core::wake::Wakeups::new();
    /// let _waiter = w.subscribe("queue:main:jobs");
    /// w.dispatch("queue-all:main:jobs");
    /// ```
    pub fn dispatch(&self, payload: &str) {
        match payload.split_once(':') {
            Some(("lock" | "semaphore" | "queue", _)) => {
                self.notify_one(payload);
            }
            Some(("queue-all", rest)) => {
                self.notify_all(&format!("queue:{rest}"));
            }
            _ => {
                self.notify_all(payload);
            }
        }
    }

    /// Wake one waiter of every key: after a reconnect, when notifications
    /// may have been missed.
    pub fn notify_every(&self) {
        let all: Vec<Arc<Notify>> = self
            .inner
            .map()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for n in all {
            n.notify_waiters();
            n.notify_one();
        }
    }

    /// Whether anybody waits on `key` in this client.
    pub fn has_waiters(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// How many [`Waiter`]s of `key` are alive in this client.
    pub fn waiter_count(&self, key: &str) -> usize {
        // The registry holds a Weak; the upgrade itself is one strong ref.
        self.get(key).map_or(0, |n| Arc::strong_count(&n) - 1)
    }

    /// The keys somebody waits on right now.
    pub fn keys(&self) -> Vec<String> {
        self.inner
            .map()
            .iter()
            .filter(|(_, w)| w.strong_count() > 0)
            .map(|(k, _)| k.to_string())
            .collect()
    }
}

/// One registration in a [`Wakeups`] registry (or a waiter that is never
/// woken, for backends without notifications).
pub struct Waiter {
    notify: Arc<Notify>,
    registry: Option<(Weak<Registry>, Box<str>)>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").finish_non_exhaustive()
    }
}

impl Waiter {
    /// A waiter no notification ever reaches: waiting falls back to polling.
    pub fn never() -> Self {
        Waiter {
            notify: Arc::new(Notify::new()),
            registry: None,
        }
    }

    /// A future that completes at the next notification. Create (and
    /// `enable`) it before the attempt it guards.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some((registry, key)) = self.registry.take() {
            if let Some(registry) = registry.upgrade() {
                registry.live.fetch_sub(1, Ordering::AcqRel);
                let mut map = registry.map();
                // Last local waiter of this key: forget the entry. The map's
                // Weak does not count, so strong_count 1 is us.
                if Arc::strong_count(&self.notify) == 1 {
                    if let Some(w) = map.get(&key) {
                        if w.as_ptr() == Arc::as_ptr(&self.notify) {
                            map.remove(&key);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Wait for `waiter` to be woken by `dispatch(payload)`.
    async fn woken_by(w: &Wakeups, waiter: &Waiter, payload: &str) {
        let f = waiter.notified();
        tokio::pin!(f);
        f.as_mut().enable();
        w.dispatch(payload);
        tokio::time::timeout(Duration::from_millis(100), f)
            .await
            .unwrap_or_else(|_| panic!("the wake-up {payload} woke nobody"));
    }

    #[tokio::test]
    async fn dispatch_routes_by_kind() {
        let w = Wakeups::new();
        woken_by(&w, &w.subscribe("lock:a:b"), "lock:a:b").await;
        woken_by(&w, &w.subscribe("queue:main:a:b"), "queue-all:main:a:b").await;
        w.dispatch("nonsense");
    }

    /// The wake-up of every kind reaches its waiters (a fencing source's
    /// issuing claim on Redlock once did not: its waiters polled).
    #[tokio::test]
    async fn every_kinds_wake_up_reaches_its_waiters() {
        let w = Wakeups::new();
        for kind in crate::util::Kind::ALL {
            let key = format!("{}:a:b", kind.as_str());
            woken_by(&w, &w.subscribe(&key), &key).await;
        }
    }

    #[tokio::test]
    async fn notify_one_wakes_one_and_entries_are_cleaned_up() {
        let w = Wakeups::new();
        let a = w.subscribe("k");
        assert_eq!(w.waiter_count("k"), 1);
        let b = w.subscribe("k");
        assert!(w.has_waiters("k"));
        assert_eq!(w.waiter_count("k"), 2);
        assert_eq!(w.waiter_count("other"), 0);
        {
            let fa = a.notified();
            let fb = b.notified();
            tokio::pin!(fa);
            tokio::pin!(fb);
            fa.as_mut().enable();
            fb.as_mut().enable();
            assert!(w.notify_one("k"));
            let woke_a = tokio::time::timeout(Duration::from_millis(50), &mut fa)
                .await
                .is_ok();
            let woke_b = tokio::time::timeout(Duration::from_millis(50), &mut fb)
                .await
                .is_ok();
            assert!(woke_a ^ woke_b, "exactly one waiter wakes");
        }
        drop(a);
        assert_eq!(w.waiter_count("k"), 1);
        drop(b);
        assert_eq!(w.waiter_count("k"), 0);
        assert!(!w.has_waiters("k"));
        assert!(!w.notify_one("k"));
        assert!(w.keys().is_empty());
    }

    /// A key's entry lives exactly as long as its last waiter: dropping one
    /// of two keeps the other reachable, dropping the last leaves nothing
    /// behind (a client waiting on many distinct names must not grow).
    #[tokio::test]
    async fn entries_live_as_long_as_their_last_waiter() {
        let w = Wakeups::new();
        let a = w.subscribe("k");
        let b = w.subscribe("k");
        drop(a);
        assert!(w.has_waiters("k"), "dropping one waiter dropped the key");
        {
            let fb = b.notified();
            tokio::pin!(fb);
            fb.as_mut().enable();
            assert!(w.notify_one("k"));
            let woke = tokio::time::timeout(Duration::from_millis(50), &mut fb).await;
            assert!(woke.is_ok(), "the remaining waiter was not woken");
        }
        drop(b);
        for i in 0..100 {
            drop(w.subscribe(&format!("name-{i}")));
        }
        assert_eq!(w.inner.map().len(), 0, "entries left behind");
        assert_eq!(
            w.inner.live.load(Ordering::Acquire),
            0,
            "waiters still counted"
        );
    }

    /// After a reconnect a backend re-subscribes the keys somebody waits on
    /// and wakes one waiter of each: `keys` lists exactly the live ones,
    /// `notify_every` reaches every key.
    #[tokio::test]
    async fn keys_and_notify_every_cover_every_live_waiter() {
        let w = Wakeups::new();
        let a = w.subscribe("a");
        let b = w.subscribe("b");
        let gone = w.subscribe("gone");
        drop(gone);
        let mut keys = w.keys();
        keys.sort();
        assert_eq!(keys, vec!["a".to_string(), "b".to_string()]);
        let fa = a.notified();
        let fb = b.notified();
        tokio::pin!(fa);
        tokio::pin!(fb);
        fa.as_mut().enable();
        fb.as_mut().enable();
        w.notify_every();
        let short = Duration::from_millis(50);
        assert!(
            tokio::time::timeout(short, &mut fa).await.is_ok(),
            "`a` not woken"
        );
        assert!(
            tokio::time::timeout(short, &mut fb).await.is_ok(),
            "`b` not woken"
        );
    }
}
