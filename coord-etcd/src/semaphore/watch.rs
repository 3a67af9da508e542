//! Wake-ups of semaphore waiters: one watch per name and client, shared by
//! the client's waiters of that name. It mirrors the name's keys (a watch
//! from the current revision, then a read at revision `R`, then every event
//! after `R`) and, whenever a grant or a queue place ends, wakes exactly the
//! local waiters that can now be granted: those in the longest prefix of
//! the queue (by create revision) whose requests fit into the free permits
//! together, as coord-memory does. Waiters that cannot be granted are not woken, so a release costs
//! one attempt of the waiter it lets in, not one per waiting client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{OwnerToken, Result};
use etcd_client::{EventType, KeyValue, WatchOptions};
use tokio::sync::watch;
use tokio::time::sleep;

use crate::client::keys::prefix_end;
use crate::client::watch::WatchSlot;
use crate::client::{AbortOnDrop, lock};
use crate::semaphore::Semaphores;
use crate::semaphore::{owner_in, parse};

/// The wake-up key of one owner's waiting acquire on `name`.
fn owner_wake(name: &str, owner_hex: &str) -> String {
    format!("sem\u{0}{name}\u{0}{owner_hex}")
}

/// The key of a name's watch slot (and the prefix of its owners' keys).
fn slot_key(name: &str) -> String {
    format!("sem\u{0}{name}")
}

/// The keys of one semaphore name, as the watch has seen them.
#[derive(Default)]
struct Mirror {
    total: u32,
    /// Grant key -> permits.
    holders: HashMap<Vec<u8>, u32>,
    /// Waiter key -> (create revision, permits, owner hex from the value).
    waiters: HashMap<Vec<u8>, (i64, u32, String)>,
}

impl Mirror {
    fn put(&mut self, base: usize, kv: &KeyValue) {
        let Some((permits, total)) = parse(kv.value()) else {
            return;
        };
        self.total = total;
        let key = kv.key().to_vec();
        if kv.key()[base..].starts_with(b"h/") {
            self.holders.insert(key, permits);
        } else {
            let hex = String::from_utf8_lossy(owner_in(kv.value()).unwrap_or_default());
            self.waiters
                .insert(key, (kv.create_revision(), permits, hex.into_owned()));
        }
    }

    fn delete(&mut self, key: &[u8]) {
        self.holders.remove(key);
        self.waiters.remove(key);
    }

    /// The owners (hex) of the queued waiters that can be granted now.
    /// ([`coord_core::permits::grantable`]).
    fn grantable(&self) -> Vec<String> {
        let free = coord_core::permits::free(self.total, self.holders.values().copied());
        let mut queue: Vec<&(i64, u32, String)> = self.waiters.values().collect();
        queue.sort_by_key(|(rev, _, _)| *rev);
        let queue = queue
            .into_iter()
            .map(|(_, permits, hex)| (hex.clone(), *permits));
        coord_core::permits::grantable(free, queue)
    }
}

impl Semaphores {
    /// Register `owner`'s waiting acquire on `name` for wake-ups, making
    /// sure the name's watch is established before returning.
    pub(crate) async fn subscribe_sem(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
    ) -> Result<Waiter> {
        let (waiter, mut ready) = {
            let mut w = lock(&self.etcd.watchers);
            let waiter = self
                .etcd
                .wakeups
                .subscribe(&owner_wake(name, &owner.to_hex()));
            let slot = w.entry(slot_key(name)).or_insert_with(|| {
                let (tx, rx) = watch::channel(false);
                let task = tokio::spawn(mirror_task(self.clone(), name.to_string(), tx));
                WatchSlot::new(rx, AbortOnDrop(task))
            });
            (waiter, slot.ready())
        };
        // Best effort: if the watch is slow to start, polling covers it.
        let _ = tokio::time::timeout(self.etcd.timeout, ready.wait_for(|r| *r)).await;
        Ok(waiter)
    }

    /// The wake-up keys of this client's waiters of `name`.
    fn sem_waiting(&self, name: &str) -> Vec<String> {
        let prefix = format!("{}\u{0}", slot_key(name));
        let mut keys = self.etcd.wakeups.keys();
        keys.retain(|k| k.starts_with(&prefix));
        keys
    }

    /// Stop the watch of `name` if nobody in this client waits on it.
    fn retire_sem_watch(&self, name: &str) -> Option<WatchSlot> {
        let mut w = lock(&self.etcd.watchers);
        if !self.sem_waiting(name).is_empty() {
            return None;
        }
        w.remove(&slot_key(name))
    }

    fn wake_sem(&self, name: &str, owners: Vec<String>) {
        for hex in owners {
            self.etcd.wakeups.notify_all(&owner_wake(name, &hex));
        }
    }
}

async fn mirror_task(shared: Arc<Semaphores>, name: String, ready: watch::Sender<bool>) {
    let op = "semaphore watch";
    let base = shared.etcd.keys.sem(&name);
    let end = prefix_end(&base);
    let mut shutdown = shared.etcd.shutdown.clone();
    let mut backoff = Duration::from_millis(50);
    let mut check = tokio::time::interval(Duration::from_secs(1));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut loaded_before = false;
    loop {
        // The watch first, from the server's current revision (so its
        // events are delivered as they happen, never replayed from history),
        // then the read; events the read already shows are skipped. A watch
        // resumed from a past revision can miss a deletion compacted away
        // meanwhile: etcd before 3.4.34/3.5.15 removes the deletion at the
        // compaction's revision under a watch catching up from it, without
        // cancelling the watch (etcd-io/etcd#18089).
        let opts = WatchOptions::new().with_range(end.clone());
        let mut wc = shared.etcd.watch_client();
        let opened = tokio::select! {
            _ = shutdown.changed() => return,
            r = tokio::time::timeout(shared.etcd.timeout, wc.watch(base.clone(), Some(opts))) => r,
        };
        if let Ok(Ok(mut stream)) = opened {
            let created = tokio::select! {
                _ = shutdown.changed() => return,
                r = tokio::time::timeout(shared.etcd.timeout, stream.message()) => r,
            };
            let created = matches!(created, Ok(Ok(Some(r))) if r.created() && !r.canceled());
            // The name in pages at one revision (one snapshot), from
            // which the watch's events are then applied.
            let read = shared.etcd.range_paged(op, &base, &end, false);
            let loaded = if created {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    r = read => r.ok(),
                }
            } else {
                None
            };
            if let Some((kvs, rev)) = loaded {
                if loaded_before {
                    coord_core::metrics::reconnect("etcd", "watch");
                }
                loaded_before = true;
                let mut mirror = Mirror::default();
                for kv in kvs {
                    mirror.put(base.len(), &kv);
                }
                ready.send_replace(true);
                backoff = Duration::from_millis(50);
                // Whatever freed permits before the watch began.
                shared.wake_sem(&name, mirror.grantable());
                loop {
                    let msg = tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = check.tick() => {
                            if let Some(slot) = shared.retire_sem_watch(&name) {
                                drop(slot);
                                return;
                            }
                            continue;
                        }
                        m = stream.message() => m,
                    };
                    let Ok(Some(resp)) = msg else { break };
                    if resp.canceled() {
                        break;
                    }
                    let mut freed = false;
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        if kv.mod_revision() <= rev {
                            continue;
                        }
                        if ev.event_type() == EventType::Delete {
                            mirror.delete(kv.key());
                            freed = true;
                        } else {
                            mirror.put(base.len(), kv);
                        }
                    }
                    if freed {
                        shared.wake_sem(&name, mirror.grantable());
                    }
                }
            }
        }
        // The watch broke (or never started): every local waiter checks
        // again, and the mirror is read afresh.
        let all = shared.sem_waiting(&name);
        for k in all {
            shared.etcd.wakeups.notify_all(&k);
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(1));
        if let Some(slot) = shared.retire_sem_watch(&name) {
            drop(slot);
            return;
        }
    }
}
