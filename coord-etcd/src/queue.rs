//! Queued lock waiters of this client: each keeps its key's lease alive
//! while it waits, watches its predecessor's key (and the key before that
//! one, while there is one), and is woken alone when either goes.
//!
//! The waiter next in line (its predecessor was the queue's first key, the
//! holder, when it last read the queue) waits for that key's deletion
//! inside its attempt, for a short slice ([`slice`]) after the attempt's
//! own keepalive was answered: the deletion seen by its watch makes it the
//! holder at once, without another round trip (no key can come before it:
//! keys only join at the back). For at most [`NEXT_IN_LINE`] in a row;
//! after that it waits to be woken as the others do.
//!
//! Which local task waits for which owner: coord-core subscribes (once per
//! acquire, without the owner) right after the owner's first attempt was
//! refused, in the same poll of the same task. The refused attempt leaves
//! its owner in a thread-local slot that the subscription takes, so the
//! waiter is registered under its owner and the wake-up reaches exactly it.
//! A subscription that finds no owner (another call order) is registered
//! under the name, and its owners' wake-ups go to every waiter of the name
//! in this client.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use coord_core::Attempt;
use coord_core::OwnerToken;
use coord_core::util::Kind;
use coord_core::wake::Waiter;
use etcd_client::{EventType, WatchFilterType, WatchOptions};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

use crate::backend::{AbortOnDrop, Shared, lock, wake_key};
use crate::claims::{Entry, EntryKey, EntryState};

thread_local! {
    /// (the client, by address; the owner whose attempt was refused).
    static LAST_REFUSED: RefCell<Option<(usize, EntryKey)>> = const { RefCell::new(None) };
}

/// Forget it: called as every attempt starts.
pub(crate) fn clear_last_refused() {
    LAST_REFUSED.with(|c| c.borrow_mut().take());
}

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

/// How long a waiter next in line keeps waiting inside its attempts (one
/// slice after another) before it waits to be woken like the others: a
/// holder that keeps the lock longer gains nothing from a faster handoff,
/// and each slice costs an attempt.
pub(crate) const NEXT_IN_LINE: Duration = Duration::from_millis(500);

/// How long one attempt of the waiter next in line waits for its
/// predecessor's deletion: a fortieth of the TTL, at most 50 ms. The grant
/// it reports counts its validity from the attempt's start, so this is the
/// most validity such a grant gives up (and the most an acquire can run
/// past its wait).
pub(crate) fn slice(ttl: Duration) -> Duration {
    (ttl / 40).min(Duration::from_millis(50))
}

/// A queued waiter's predecessor: its key and create revision.
pub(crate) type Pred = (Vec<u8>, i64);

/// What the watch of a waiter's predecessor saw.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum PredSignal {
    /// Nothing yet.
    Waiting,
    /// That key (with that create revision) is gone: deleted, or already
    /// gone when the watch began.
    Gone,
    /// The waiter must read the queue again: the server cancelled the
    /// watch, or the waiter's own lease is gone.
    Recheck,
}

/// Whether `state` is a waiter next in line whose predecessor is gone.
fn next_in_line_gone(state: &EntryState) -> bool {
    matches!(state, EntryState::Queued(q)
        if q.pred.is_some() && q.pred2.is_none() && *q.signal.borrow() == PredSignal::Gone)
}

/// A queued waiter's state.
pub(crate) struct Queued {
    /// The key just before ours.
    pred: Option<Pred>,
    /// The key just before `pred`, when last read; `None`: `pred` was the
    /// first key (the holder), so this waiter is next in line.
    pred2: Option<Pred>,
    /// When the predecessor's deletion was seen.
    pred_gone_at: Option<Instant>,
    /// When this waiter was first seen next in line behind `pred`.
    next_since: Option<Instant>,
    /// What the watch of `pred` saw.
    signal: watch::Sender<PredSignal>,
    last_attempt: Instant,
    watch: Option<AbortOnDrop>,
    watch2: Option<AbortOnDrop>,
    _keepalive: AbortOnDrop,
}

impl Shared {
    /// Remember the owner whose attempt was just refused (see the module
    /// doc).
    pub(crate) fn set_last_refused(&self, kind: Kind, name: &str, owner: &OwnerToken) {
        let me = self as *const Shared as usize;
        LAST_REFUSED.with(|c| *c.borrow_mut() = Some((me, (kind, name.into(), *owner.as_bytes()))));
    }

    /// Register a local waiter of lock `name` (see the module doc).
    pub(crate) fn subscribe_lock(&self, kind: Kind, name: &str) -> Waiter {
        let me = self as *const Shared as usize;
        let bound = LAST_REFUSED
            .with(|c| c.borrow_mut().take())
            .filter(|(who, ek)| *who == me && ek.0 == kind && &*ek.1 == name)
            .map(|(_, ek)| ek);
        match bound {
            Some(ek) => self.wakeups.subscribe(&owner_wake_key(&ek)),
            None => self.wakeups.subscribe(&wake_key(kind, name)),
        }
    }

    /// Record that `ek` (created at `rev`) waits behind `pred`, and `pred`
    /// behind `pred2` (`None`: `pred` is the first key), keeping its lease
    /// alive meanwhile. For a waiter next in line within
    /// [`NEXT_IN_LINE`]: how to wait for its predecessor's deletion.
    fn set_queued(
        self: &Arc<Self>,
        ek: &EntryKey,
        rev: i64,
        pred: Option<Pred>,
        pred2: Option<Pred>,
    ) -> Option<watch::Receiver<PredSignal>> {
        let now = Instant::now();
        let mut entries = lock(&self.entries);
        let e = entries.get_mut(ek)?;
        e.rev = rev;
        let new_watch = |p: &Option<Pred>, first: bool| {
            p.as_ref()
                .map(|p| self.spawn_pred_watch(ek.clone(), p.clone(), first))
        };
        if !matches!(e.state, EntryState::Queued(_)) {
            let keepalive = self.spawn_waiter_keepalive(ek.clone(), e.lease, e.lease_ttl);
            e.state = EntryState::Queued(Queued {
                watch: new_watch(&pred, true),
                watch2: new_watch(&pred2, false),
                pred: pred.clone(),
                pred2: pred2.clone(),
                pred_gone_at: None,
                next_since: None,
                signal: watch::Sender::new(PredSignal::Waiting),
                last_attempt: now,
                _keepalive: keepalive,
            });
        }
        let EntryState::Queued(q) = &mut e.state else {
            return None;
        };
        q.last_attempt = now;
        let signal = *q.signal.borrow();
        if q.pred != pred || (q.watch.is_none() && signal != PredSignal::Gone) {
            q.watch = new_watch(&pred, true);
            q.pred = pred;
            q.pred_gone_at = None;
            q.next_since = None;
            q.signal = watch::Sender::new(PredSignal::Waiting);
        }
        if q.pred2 != pred2 || (q.watch2.is_none() && pred2.is_some()) {
            q.watch2 = new_watch(&pred2, false);
            q.pred2 = pred2;
        }
        if q.pred.is_none() || q.pred2.is_some() {
            return None;
        }
        let since = *q.next_since.get_or_insert(now);
        (now < since + NEXT_IN_LINE).then(|| q.signal.subscribe())
    }

    /// A queued attempt's outcome (the attempt began at `start`, and the
    /// server keeps its key's lease at least `ttl` from then): record it
    /// (see [`set_queued`](Self::set_queued)); a waiter next in line then
    /// waits up to a [`slice`] for its predecessor's deletion, and holds
    /// the lock once it is seen: no key can come before it any more (keys
    /// join only at the back, and its own lease lives). A slice that ends
    /// asks for the next attempt at once (`expires_in` zero).
    pub(crate) async fn wait_in_line(
        self: &Arc<Self>,
        ek: &EntryKey,
        (rev, lease): (i64, i64),
        (pred, pred2): (Option<Pred>, Option<Pred>),
        start: Instant,
        ttl: Duration,
    ) -> Attempt {
        let Some(mut signal) = self.set_queued(ek, rev, pred, pred2) else {
            return Attempt::Held { expires_in: None };
        };
        let until = Instant::now() + slice(ttl);
        let seen = tokio::time::timeout_at(until, signal.wait_for(|s| *s != PredSignal::Waiting))
            .await
            .map(|r| r.map(|s| *s));
        match seen {
            Ok(Ok(PredSignal::Gone)) => self.next_holds(ek, rev, lease, start + ttl),
            // Woken (wake_owner): the next attempt reads the queue anew.
            Ok(_) => Attempt::Held { expires_in: None },
            Err(_) => Attempt::Held {
                expires_in: Some(Duration::ZERO),
            },
        }
    }

    /// The waiter next in line saw its predecessor go: it holds the lock,
    /// if its entry is still that queued key on that lease.
    fn next_holds(&self, ek: &EntryKey, rev: i64, lease: i64, deadline: Instant) -> Attempt {
        let mut entries = lock(&self.entries);
        let attempt = match entries.get_mut(ek) {
            Some(
                e @ Entry {
                    state: EntryState::Queued(_),
                    ..
                },
            ) if e.rev == rev && e.lease == lease && next_in_line_gone(&e.state) => {
                e.keeper = None;
                e.state = EntryState::Held { deadline };
                Attempt::Granted(coord_core::FencingToken(rev as u64))
            }
            _ => Attempt::Held { expires_in: None },
        };
        self.prune(&mut entries);
        attempt
    }

    /// Watch the predecessor's key until it is deleted, then wake the
    /// waiter. The watch starts at the server's current revision (so the
    /// server delivers its events as they happen, never replays them from
    /// history), and once it is established the key is read: absent, or
    /// another key of the same name (another create revision), means it left
    /// before the watch began. A watch resumed from a past revision can miss
    /// the deletion: etcd before 3.4.34/3.5.15 compacts away a deletion
    /// whose revision is the compaction's while a watch from that revision
    /// is catching up, without cancelling the watch (etcd-io/etcd#18089).
    /// A stream that breaks is opened and checked again the same way.
    /// `first`: `pred` is the key just before the waiter's (else the one
    /// before that, whose end only wakes the waiter to read the queue).
    fn spawn_pred_watch(self: &Arc<Self>, ek: EntryKey, pred: Pred, first: bool) -> AbortOnDrop {
        let shared = self.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            let mut backoff = Duration::from_millis(50);
            let mut broke = false;
            loop {
                let gone = tokio::select! {
                    _ = shutdown.changed() => return,
                    g = shared.watch_pred(&pred, broke) => g,
                };
                match gone {
                    Ok(deleted) if first => {
                        shared.pred_gone(&ek, &pred, deleted);
                        return;
                    }
                    Ok(_) => {
                        shared.pred2_gone(&ek, &pred);
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
    /// `Err(opened)` if
    /// the watch broke, `opened` telling whether it was established first.
    /// A watch established after an earlier one broke (`reopening`) counts
    /// as a reconnect.
    async fn watch_pred(&self, pred: &Pred, reopening: bool) -> std::result::Result<bool, bool> {
        let opts = WatchOptions::new().with_filters([WatchFilterType::NoPut]);
        let mut wc = self.client.watch_client();
        let mut stream =
            match tokio::time::timeout(self.timeout, wc.watch(pred.0.clone(), Some(opts))).await {
                Ok(Ok(stream)) => stream,
                _ => return Err(false),
            };
        // etcd answers a new watch with a "created" response first.
        match tokio::time::timeout(self.timeout, stream.message()).await {
            Ok(Ok(Some(resp))) if resp.canceled() => return Ok(false),
            Ok(Ok(Some(resp))) if resp.created() => {
                if reopening {
                    coord_core::metrics::reconnect("etcd", "watch");
                }
            }
            _ => return Err(false),
        }
        match self.get("lock wait", pred.0.clone(), None).await {
            Ok(kvs) if kvs.first().is_some_and(|kv| kv.create_revision() == pred.1) => {}
            Ok(_) => return Ok(true),
            Err(_) => return Err(true),
        }
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    let deleted = resp
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete);
                    if resp.canceled() && !deleted {
                        return Ok(false);
                    }
                    if deleted {
                        return Ok(true);
                    }
                }
                _ => return Err(true),
            }
        }
    }

    /// The predecessor `pred` of `ek` left (`deleted`; else its watch was
    /// cancelled): tell a waiting attempt, and wake the waiter of `ek`.
    /// Only if `pred` is still the waiter's predecessor: a watch replaced
    /// (and aborted) while it reported must not speak for the next one.
    fn pred_gone(&self, ek: &EntryKey, pred: &Pred, deleted: bool) {
        let watch = match lock(&self.entries).get_mut(ek) {
            Some(Entry {
                state: EntryState::Queued(q),
                ..
            }) if q.pred.as_ref() == Some(pred) => {
                q.pred_gone_at = Some(Instant::now());
                q.signal.send_replace(if deleted {
                    PredSignal::Gone
                } else {
                    PredSignal::Recheck
                });
                q.watch.take()
            }
            _ => None,
        };
        self.wake_owner(ek);
        // This runs on the watch task itself, which returns right after.
        drop(watch);
    }

    /// The key before `ek`'s predecessor (`pred`) left: `ek` may be next in
    /// line now; wake its waiter to read the queue.
    fn pred2_gone(&self, ek: &EntryKey, pred: &Pred) {
        let watch = match lock(&self.entries).get_mut(ek) {
            Some(Entry {
                state: EntryState::Queued(q),
                ..
            }) if q.pred2.as_ref() == Some(pred) => q.watch2.take(),
            _ => None,
        };
        self.wake_owner(ek);
        drop(watch);
    }

    /// A waiting attempt of `ek` must return: the queue is to be read anew.
    fn recheck(&self, ek: &EntryKey) {
        if let Some(Entry {
            state: EntryState::Queued(q),
            ..
        }) = lock(&self.entries).get(ek)
        {
            q.signal.send_replace(PredSignal::Recheck);
        }
    }

    fn wake_owner(&self, ek: &EntryKey) {
        if !self.wakeups.notify_one(&owner_wake_key(ek)) {
            self.wakeups.notify_all(&wake_key(ek.0, &ek.1));
        }
    }

    /// Keep a queued key's lease alive while its waiter lives; remove the
    /// key when the waiter is gone without leaving the queue.
    fn spawn_waiter_keepalive(self: &Arc<Self>, ek: EntryKey, lease: i64, ttl: u64) -> AbortOnDrop {
        let shared = self.clone();
        let period = (Duration::from_secs(ttl) / 3).max(Duration::from_millis(300));
        let grace = self.timeout * 2 + PENDING_GRACE;
        AbortOnDrop(tokio::spawn(async move {
            let mut shutdown = shared.shutdown.clone();
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
                match shared.keepalive_once(lease, "lock wait keepalive").await {
                    Ok(true) => next_keepalive = Instant::now() + period,
                    Ok(false) => {
                        // The key is gone with its lease: the waiter's next
                        // attempt queues again.
                        shared.recheck(&ek);
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
        let bound = self.wakeups.has_waiters(&owner_wake_key(ek));
        let any = bound || self.wakeups.has_waiters(&wake_key(ek.0, &ek.1));
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
