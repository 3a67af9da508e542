//! Shared watches, one per name and client (elections, barriers, work
//! queue lanes): every local waiter of the name is woken on a change.

use std::sync::Arc;
use std::time::Duration;

use coord_core::Result;
use coord_core::wake::Waiter;
use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use crate::client::{AbortOnDrop, Etcd, lock};

pub(crate) struct WatchSlot {
    ready: watch::Receiver<bool>,
    _task: AbortOnDrop,
}

impl WatchSlot {
    /// A slot for a watch task started elsewhere (semaphores), which sends
    /// `true` on `ready` once established.
    pub(crate) fn new(ready: watch::Receiver<bool>, task: AbortOnDrop) -> Self {
        WatchSlot { ready, _task: task }
    }

    /// Whether the slot's watch is established (`true` once it is).
    pub(crate) fn ready(&self) -> watch::Receiver<bool> {
        self.ready.clone()
    }
}

/// What a shared (per name) watch does with events.
#[derive(Clone, Copy)]
pub(crate) enum WatchKind {
    /// Wake every local waiter on any change (elections).
    AnyChange,
    /// Wake every local waiter on a put for which the function holds,
    /// given the key past the watched prefix and the value; never on a
    /// deletion.
    Puts(fn(&[u8], &[u8]) -> bool),
    /// Wake every local waiter when the generation `of` reads from the
    /// key's value changes, or the key goes; while local waiters wait, the
    /// key's lease is kept alive every `keep_alive` (as `op`).
    Generation {
        of: fn(&[u8]) -> Option<u64>,
        keep_alive: Duration,
        op: &'static str,
    },
}

impl Etcd {
    // ---------------------------------------------------------------

    /// Register a local waiter on `wake`, making sure a watch on `key`
    /// (`end`: range end) is established before returning.
    pub(crate) async fn subscribe_watch(
        self: &Arc<Self>,
        wake: String,
        key: Vec<u8>,
        end: Option<Vec<u8>>,
        kind: WatchKind,
    ) -> Result<Waiter> {
        let (waiter, mut ready) = {
            let mut w = lock(&self.watchers);
            let waiter = self.wakeups.subscribe(&wake);
            let slot = w.entry(wake.clone()).or_insert_with(|| {
                let (tx, rx) = watch::channel(false);
                let task = tokio::spawn(shared_watch_task(
                    self.clone(),
                    wake.clone(),
                    key,
                    end,
                    kind,
                    tx,
                ));
                WatchSlot {
                    ready: rx,
                    _task: AbortOnDrop(task),
                }
            });
            (waiter, slot.ready.clone())
        };
        // Best effort: if the watch is slow to start, polling covers it.
        let _ = tokio::time::timeout(self.timeout, ready.wait_for(|r| *r)).await;
        Ok(waiter)
    }

    /// Stop a shared watch nobody waits on. Returns whether it was retired.
    fn retire_watch(&self, wake: &str) -> Option<WatchSlot> {
        let mut w = lock(&self.watchers);
        if self.wakeups.has_waiters(wake) {
            return None;
        }
        w.remove(wake)
    }
}

async fn shared_watch_task(
    shared: Arc<Etcd>,
    wake: String,
    key: Vec<u8>,
    end: Option<Vec<u8>>,
    kind: WatchKind,
    ready: watch::Sender<bool>,
) {
    let mut shutdown = shared.shutdown.clone();
    let mut start_rev = 0i64;
    let mut last_gen: Option<u64> = None;
    let mut backoff = Duration::from_millis(50);
    let mut kept_alive = Instant::now();
    let mut check = tokio::time::interval(Duration::from_secs(1));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut opened_before = false;
    loop {
        let mut opts = WatchOptions::new();
        if let Some(e) = &end {
            opts = opts.with_range(e.clone());
        }
        if start_rev > 0 {
            opts = opts.with_start_revision(start_rev);
        }
        let resumed = opened_before;
        opened_before = true;
        let mut wc = shared.watch_client();
        let opened = tokio::select! {
            _ = shutdown.changed() => return,
            r = tokio::time::timeout(shared.timeout, wc.watch(key.clone(), Some(opts))) => r,
        };
        if let Ok(Ok(mut stream)) = opened {
            loop {
                let msg = tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = check.tick() => {
                        if let Some(slot) = shared.retire_watch(&wake) {
                            drop(slot);
                            return;
                        }
                        if let WatchKind::Generation { keep_alive, op, .. } = kind {
                            if kept_alive.elapsed() >= keep_alive {
                                // Local waiters wait on this key: keep it
                                // from expiring.
                                kept_alive = Instant::now();
                                shared.keep_lease_of(&key, op).await;
                            }
                        }
                        continue;
                    }
                    m = stream.message() => m,
                };
                match msg {
                    Ok(Some(resp)) => {
                        if resp.created() {
                            if let Some(h) = resp.header() {
                                start_rev = h.revision() + 1;
                            }
                            ready.send_replace(true);
                            backoff = Duration::from_millis(50);
                            if resumed {
                                coord_core::metrics::reconnect("etcd", "watch");
                                // Every local waiter checks again now that
                                // the watch is back: it may have missed a
                                // change while it was down (one after a
                                // compaction cancelled it, when it opens
                                // at the current revision), and a watch
                                // resumed from a past revision can miss a
                                // deletion compacted away meanwhile
                                // (etcd-io/etcd#18089, etcd before
                                // 3.4.34/3.5.15).
                                shared.wakeups.notify_all(&wake);
                            }
                        }
                        if resp.canceled() {
                            if resp.compact_revision() > 0 {
                                start_rev = 0;
                            }
                            shared.wakeups.notify_all(&wake);
                            break;
                        }
                        let mut wake_all = false;
                        for ev in resp.events() {
                            if let Some(kv) = ev.kv() {
                                start_rev = start_rev.max(kv.mod_revision() + 1);
                                match kind {
                                    WatchKind::AnyChange => wake_all = true,
                                    WatchKind::Puts(wakes) => {
                                        let put = ev.event_type() == EventType::Put;
                                        let rest = kv.key().get(key.len()..).unwrap_or_default();
                                        if put && wakes(rest, kv.value()) {
                                            wake_all = true;
                                        }
                                    }
                                    WatchKind::Generation { of, .. } => {
                                        let g = if ev.event_type() == EventType::Delete {
                                            None
                                        } else {
                                            of(kv.value())
                                        };
                                        if g.is_none() || g != last_gen {
                                            wake_all = true;
                                        }
                                        last_gen = g;
                                    }
                                }
                            }
                        }
                        if wake_all {
                            shared.wakeups.notify_all(&wake);
                        }
                    }
                    _ => break,
                }
            }
        }
        // The stream broke: wake everybody to re-check, then resume from
        // the last revision seen.
        shared.wakeups.notify_all(&wake);
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
        if let Some(slot) = shared.retire_watch(&wake) {
            drop(slot);
            return;
        }
    }
}
