//! Queued lock waiters of this client: each keeps its key's lease alive
//! while it waits, watches only its predecessor's key, and is woken alone
//! when that key goes.
//!
//! Which local task waits for which owner: coord-core subscribes with the
//! owner right after its attempt was refused. An owner whose attempt
//! queued it (a fair claim, remembered as tried) is registered under its
//! owner, so the wake-up reaches exactly it; any other subscription is
//! registered under the name, and its owners' wake-ups go to every waiter
//! of the name in this client.

use std::sync::Arc;
use std::time::Duration;

use coord_core::OwnerToken;
use coord_core::util::Kind;
use coord_core::wake::Waiter;
use etcd_client::{EventType, WatchOptions};
use tokio::time::{Instant, sleep, sleep_until};

use crate::claim::Claims;
use crate::claim::entries::{Entry, EntryKey, EntryState, Pred, Queued, TRIED_MEMORY, entry_key};
use crate::client::{AbortOnDrop, lock, wake_key};

#[cfg(test)]
mod tests;

fn owner_wake_key(ek: &EntryKey) -> String {
    let mut k = wake_key(ek.0, &ek.1);
    k.push('\u{0}');
    for b in ek.2 {
        k.push_str(&format!("{b:02x}"));
    }
    k
}

/// How long a queued waiter whose predecessor is gone, and whose task is
/// not known to be alive, may take to attempt again before it is presumed
/// gone and its key removed: at least this, plus two call timeouts (during
/// a leader election one attempt can take a call timeout).
const PENDING_GRACE: Duration = Duration::from_secs(2);

impl Claims {
    /// Register a local waiter of lock `name` for `owner` (see the module
    /// doc).
    pub(crate) fn subscribe_lock(&self, kind: Kind, name: &str, owner: &OwnerToken) -> Waiter {
        let ek = entry_key(kind, name, owner);
        let queued = lock(&self.tried)
            .get(&ek)
            .is_some_and(|at| *at + TRIED_MEMORY > Instant::now());
        match queued {
            true => self.etcd.wakeups.subscribe(&owner_wake_key(&ek)),
            false => self.etcd.wakeups.subscribe(&wake_key(kind, name)),
        }
    }

    /// Record that `ek` waits behind `pred` (its key and create revision;
    /// `pred_head`: the same read showed it first), keeping its lease alive
    /// meanwhile; the server keeps that lease at least until `fresh_until`.
    pub(crate) fn set_queued(
        self: &Arc<Self>,
        ek: &EntryKey,
        rev: i64,
        pred: Option<Pred>,
        pred_head: bool,
        fresh_until: Instant,
    ) {
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        let Some(e) = entries.get_mut(ek) else { return };
        e.rev = rev;
        let new_watch = |pred: &Option<Pred>| {
            pred.as_ref()
                .map(|p| self.spawn_pred_watch(ek.clone(), p.clone()))
        };
        match &mut e.state {
            EntryState::Queued(q) => {
                q.last_attempt = now;
                q.fresh_until = q.fresh_until.max(Some(fresh_until));
                if q.pred != pred || q.watch.is_none() {
                    q.watch = new_watch(&pred);
                    q.pred = pred;
                    q.pred_head = false;
                    q.pred_deleted = false;
                    q.pred_gone_at = None;
                }
                q.pred_head |= pred_head;
            }
            state => {
                let keepalive = self.spawn_waiter_keepalive(ek.clone(), e.lease, e.lease_ttl);
                *state = EntryState::Queued(Queued {
                    watch: new_watch(&pred),
                    pred,
                    pred_head,
                    pred_deleted: false,
                    fresh_until: Some(fresh_until),
                    pred_gone_at: None,
                    last_attempt: now,
                    _keepalive: keepalive,
                });
            }
        }
    }

    /// Watch the predecessor's key until it is deleted, then wake the
    /// waiter. The watch starts at the current revision of the member that
    /// serves it (never from a revision asked for), and once it is
    /// established the key is read: absent, or another key of the same
    /// name (another create revision), means it left before that read; a
    /// deletion after the read is its deletion. Events up to the read are
    /// not: a member that is behind (a follower catching up after a pause)
    /// starts the watch before the predecessor was created, and replays the
    /// deletion of an earlier key of the same name. A watch resumed from a
    /// past revision can miss the deletion: etcd before 3.4.34/3.5.15
    /// compacts away a deletion whose revision is the compaction's while a
    /// watch from that revision is catching up, without cancelling the
    /// watch (etcd-io/etcd#18089).
    /// A stream that breaks is opened and checked again the same way.
    fn spawn_pred_watch(self: &Arc<Self>, ek: EntryKey, pred: Pred) -> AbortOnDrop {
        let shared = self.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut shutdown = shared.etcd.shutdown.clone();
            let mut backoff = Duration::from_millis(50);
            let mut broke = false;
            loop {
                let gone = tokio::select! {
                    _ = shutdown.changed() => return,
                    g = shared.watch_pred(&ek, &pred, broke) => g,
                };
                match gone {
                    Ok(deleted) => {
                        shared.pred_gone(&ek, deleted);
                        return;
                    }
                    Err(opened) => {
                        broke = true;
                        if opened {
                            backoff = Duration::from_millis(50);
                        }
                    }
                }
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }))
    }

    /// One watch of `pred` (see [`spawn_pred_watch`](Self::spawn_pred_watch)):
    /// `Ok(true)` once the key is gone, `Ok(false)` if the server cancelled
    /// the watch (the waiter attempts again, which reads the queue anew);
    /// `Err(opened)` if the watch broke, `opened` telling whether it was
    /// established first. A watch established after an earlier one broke
    /// (`reopening`) counts as a reconnect. A put on `pred` after its
    /// creation (its head marker, or a holder's extend with another TTL),
    /// or a version above 1 when the watch began, records that `pred` was
    /// the holder ([`pred_was_head`](Self::pred_was_head)); it wakes nobody.
    async fn watch_pred(
        self: &Arc<Self>,
        ek: &EntryKey,
        pred: &Pred,
        reopening: bool,
    ) -> std::result::Result<bool, bool> {
        let opts = WatchOptions::new();
        let mut wc = self.etcd.watch_client();
        let mut stream =
            match tokio::time::timeout(self.etcd.timeout, wc.watch(pred.0.clone(), Some(opts)))
                .await
            {
                Ok(Ok(stream)) => stream,
                _ => return Err(false),
            };
        // etcd answers a new watch with a "created" response first.
        match tokio::time::timeout(self.etcd.timeout, stream.message()).await {
            Ok(Ok(Some(resp))) if resp.canceled() => return Ok(false),
            Ok(Ok(Some(resp))) if resp.created() => {
                if reopening {
                    coord_core::metrics::reconnect("etcd", "watch");
                }
            }
            _ => return Err(false),
        }
        // The key as of revision `read`: only events after it say what
        // became of `pred`. Earlier ones can predate `pred` itself (see
        // `spawn_pred_watch`): a key name is reused by the claims of one
        // lease (`claim/attempt.rs`), and the deletion of an earlier key of
        // the name is not `pred`'s.
        let read = self
            .etcd
            .call_kv("lock wait", |mut c| {
                let k = pred.0.clone();
                async move { c.get(k, None).await }
            })
            .await;
        let (kvs, read) = match read {
            Ok(mut r) => match r.header().map(|h| h.revision()) {
                Some(rev) => (r.take_kvs(), rev),
                None => return Err(true),
            },
            Err(_) => return Err(true),
        };
        match kvs.first() {
            Some(kv) if kv.create_revision() == pred.1 => {
                if kv.version() > 1 {
                    self.pred_was_head(ek, pred);
                }
            }
            _ => return Ok(true),
        }
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        return Ok(false);
                    }
                    let events: Vec<_> = resp
                        .events()
                        .iter()
                        .filter(|e| e.kv().is_some_and(|kv| kv.mod_revision() > read))
                        .collect();
                    if events.iter().any(|e| e.event_type() == EventType::Delete) {
                        return Ok(true);
                    }
                    let marked = events.iter().any(|e| {
                        e.kv()
                            .is_some_and(|kv| kv.create_revision() == pred.1 && kv.version() > 1)
                    });
                    if marked {
                        self.pred_was_head(ek, pred);
                    }
                }
                _ => return Err(true),
            }
        }
    }

    /// The predecessor of `ek` left (`deleted`), or its watch was
    /// cancelled: wake the waiter of `ek`.
    fn pred_gone(&self, ek: &EntryKey, deleted: bool) {
        let watch = match lock(&self.entries).get_mut(ek) {
            Some(Entry {
                state: EntryState::Queued(q),
                ..
            }) => {
                q.pred_deleted = deleted;
                q.pred_gone_at = Some(Instant::now());
                q.watch.take()
            }
            _ => None,
        };
        self.wake_owner(ek);
        // This runs on the watch task itself, which returns right after.
        drop(watch);
    }

    pub(crate) fn wake_owner(&self, ek: &EntryKey) {
        if !self.etcd.wakeups.notify_one(&owner_wake_key(ek)) {
            self.etcd.wakeups.notify_all(&wake_key(ek.0, &ek.1));
        }
    }

    /// Keep a queued key's lease alive while its waiter lives; remove the
    /// key when the waiter is gone without leaving the queue.
    fn spawn_waiter_keepalive(self: &Arc<Self>, ek: EntryKey, lease: i64, ttl: u64) -> AbortOnDrop {
        let shared = self.clone();
        let period = (Duration::from_secs(ttl) / 3).max(Duration::from_millis(300));
        let grace = self.etcd.timeout * 2 + PENDING_GRACE;
        AbortOnDrop(tokio::spawn(async move {
            let mut shutdown = shared.etcd.shutdown.clone();
            let mut next_keepalive = Instant::now() + period;
            loop {
                let next_check = Instant::now() + Duration::from_millis(500);
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = sleep_until(next_keepalive.min(next_check)) => {}
                }
                if shared.abandoned(&ek, lease, grace) {
                    tracing::debug!(name = %ek.1, "etcd lock waiter presumed gone; leaving the queue");
                    shared.drop_entry(&ek);
                    return;
                }
                if Instant::now() < next_keepalive {
                    continue;
                }
                let sent = Instant::now();
                match shared
                    .etcd
                    .keepalive_once(lease, "lock wait keepalive")
                    .await
                {
                    Ok(true) => {
                        shared.set_fresh(&ek, lease, Some(sent + Duration::from_secs(ttl)));
                        next_keepalive = Instant::now() + period;
                    }
                    Ok(false) => {
                        shared.set_fresh(&ek, lease, None);
                        // The key is gone with its lease: the waiter's next
                        // attempt queues again.
                        shared.wake_owner(&ek);
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "keepalive of a queued waiter failed; retrying");
                        next_keepalive = Instant::now() + Duration::from_millis(200);
                    }
                }
            }
        }))
    }

    /// Whether the queued waiter `ek` (on `lease`) is gone: nobody in this
    /// client waits for it, or its predecessor left `grace` ago and it did
    /// not attempt since (while no task is known to wait for this owner).
    fn abandoned(&self, ek: &EntryKey, lease: i64, grace: Duration) -> bool {
        let bound = self.etcd.wakeups.has_waiters(&owner_wake_key(ek));
        let any = bound || self.etcd.wakeups.has_waiters(&wake_key(ek.0, &ek.1));
        let now = Instant::now();
        match lock(&self.entries).get(ek) {
            Some(Entry {
                state: EntryState::Queued(q),
                lease: l,
                ..
            }) if *l == lease => {
                let orphan = !any && q.last_attempt + Duration::from_secs(2) <= now;
                let stale = !bound
                    && q.pred_gone_at
                        .is_some_and(|p| p + grace <= now && q.last_attempt < p);
                orphan || stale
            }
            _ => false,
        }
    }
}
