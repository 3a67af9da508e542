//! FIFO semaphores. Every key of a name lives under `<prefix>sem/<name>/`:
//!
//! - `h/<owner hex>`: a grant, value `"<permits> <total> <slot>,<slot>.."`,
//!   on an etcd lease of the grant's TTL (one lease per grant, as for lock
//!   claims; spare leases are reused); its create revision is the fencing
//!   token (as for locks: etcd's revision, durable and rising across
//!   restarts, never repeated).
//! - `s/<i>` (`0 <= i < total`): permit slot `i`, taken by a grant, on the
//!   grant's lease (value: the owner). A grant of `n` permits takes `n`
//!   free slots in the same transaction as its `h/` key, each compared to
//!   be absent, so the server never lets more than `total` permits be
//!   held, and grants that take different slots do not conflict.
//! - `w/<owner hex>`: a queued waiter, value `"<permits> <total>"`, on a
//!   lease of [`QUEUE_ENTRY_TTL`] renewed by the waiter's attempts (one at
//!   least every [`QUEUE_REFRESH`]); the queue is ordered by create
//!   revision.
//!
//! An attempt reads the name and is granted only if its request and every
//! request queued ahead of it (the whole queue for an owner not in it) fit
//! into the free permits; it then takes the free slots after those the
//! requests ahead of it will take (the `ahead`-th free slot on), so the
//! waiters ahead keep room. A refused attempt with `queue` joins (or
//! renews its place in) the queue; without it, writes nothing. Wake-ups
//! come from a watch per name and client (`sem_watch.rs`).

use std::sync::Arc;
use std::time::Duration;

use coord_core::wake::Waiter;
use coord_core::{Attempt, Error, FencingToken, OwnerToken, PermitRequest, Result, async_trait};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::backend::{EtcdBackend, Shared, header_rev, is_lease_not_found, lock, secs};
use crate::barrier::corrupt;
use crate::keys::prefix_end;
use crate::pool::Keeper;

/// How long a queued waiter's place lasts without an attempt renewing it
/// (as coord-memory's `QUEUE_ENTRY_TTL`).
pub(crate) const QUEUE_ENTRY_TTL: Duration = Duration::from_secs(30);
/// The longest a queued waiter is told to sleep before attempting again,
/// which renews its place.
pub(crate) const QUEUE_REFRESH: Duration = Duration::from_secs(10);
/// A place is renewed by an attempt at most this often.
const RENEW_AFTER: Duration = Duration::from_secs(5);
/// Reads and compare-and-swaps per attempt before it gives up for now.
const CAS_ROUNDS: usize = 8;
/// When the local bookkeeping is swept.
const PRUNE_AT: usize = 1024;

/// A semaphore claim of this client: (name, owner).
pub(crate) type SemKey = (Box<str>, [u8; 16]);

/// This client's knowledge of one owner's grant and queue place.
#[derive(Default)]
pub(crate) struct SemLocal {
    /// The waiter key's lease and when it was last renewed.
    pub(crate) waiter: Option<(i64, Instant)>,
    /// The grant's lease (also one whose write's reply was lost).
    pub(crate) grant: Option<Grant>,
    /// The grant lease's keepalive stream, if open.
    pub(crate) keeper: Option<Keeper>,
    /// The slots the grant holds.
    pub(crate) slots: Vec<u32>,
}

#[derive(Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) lease: i64,
    /// The lease's TTL in seconds.
    pub(crate) ttl: u64,
    /// The server keeps the lease at least until then.
    pub(crate) deadline: Instant,
}

/// The state of a name as one read saw it.
struct View {
    free: u32,
    mine: Option<KeyValue>,
    my_place: Option<KeyValue>,
    /// Permits of the waiters queued ahead of the owner (all of them if it
    /// is not queued).
    ahead: u32,
    /// The free slots, ascending.
    slots: Vec<u32>,
}

/// `(permits, total)` of a grant's or waiter's value.
pub(crate) fn parse(v: &[u8]) -> Option<(u32, u32)> {
    let mut it = std::str::from_utf8(v).ok()?.split(' ');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The slots of a grant's value (`"<permits> <total> <slot>,<slot>.."`).
pub(crate) fn slots_of(v: &[u8]) -> Vec<u32> {
    let s = std::str::from_utf8(v).unwrap_or("");
    s.split(' ')
        .nth(2)
        .map(|l| l.split(',').filter_map(|i| i.parse().ok()).collect())
        .unwrap_or_default()
}

fn mismatch(asked: u32, bound: u32) -> Error {
    Error::invalid(
        "permits_total",
        format!(
            "is {asked}, but the semaphore is in use with permits_total {bound}; \
             the total binds while the name has holders or waiters"
        ),
    )
}

/// The keys of one owner's claim on a name.
pub(crate) struct Names {
    pub(crate) base: Vec<u8>,
    pub(crate) end: Vec<u8>,
    pub(crate) hold: Vec<u8>,
    pub(crate) wait: Vec<u8>,
}

impl Names {
    pub(crate) fn slot(&self, i: u32) -> Vec<u8> {
        [&self.base[..], format!("s/{i}").as_bytes()].concat()
    }
}

impl Shared {
    pub(crate) fn sem_names(&self, name: &str, owner: &OwnerToken) -> Names {
        let base = self.keys.sem(name);
        let end = prefix_end(&base);
        let hex = owner.to_hex();
        let hold = [&base[..], b"h/", hex.as_bytes()].concat();
        let wait = [&base[..], b"w/", hex.as_bytes()].concat();
        Names {
            base,
            end,
            hold,
            wait,
        }
    }

    pub(crate) fn sem_local<R>(&self, sk: &SemKey, f: impl FnOnce(&mut SemLocal) -> R) -> R {
        let mut m = lock(&self.sems);
        if m.len() >= PRUNE_AT {
            let now = Instant::now();
            let old = QUEUE_ENTRY_TTL * 2;
            m.retain(|_, s| {
                s.grant.is_some_and(|g| g.deadline + old > now)
                    || s.waiter.is_some_and(|(_, at)| at + old > now)
            });
        }
        f(m.entry(sk.clone()).or_default())
    }

    /// Forget `sk` locally, revoking its leases in the background.
    pub(crate) fn sem_forget(self: &Arc<Self>, sk: &SemKey) {
        if let Some(s) = lock(&self.sems).remove(sk) {
            for l in s
                .waiter
                .map(|w| w.0)
                .into_iter()
                .chain(s.grant.map(|g| g.lease))
            {
                self.revoke_later(l);
            }
        }
    }

    /// A lease of `ttl` seconds for a new key: a spare refreshed now, or a
    /// new grant; the server keeps it at least `ttl` from the instant
    /// returned (taken before the call).
    pub(crate) async fn sem_lease(
        &self,
        ttl: u64,
        op: &'static str,
    ) -> Result<(i64, Option<Keeper>, Instant)> {
        let since = Instant::now();
        while let Some(s) = self.take_spare(ttl) {
            if let (true, keeper) = self.refresh(s.id, s.keeper, op).await? {
                return Ok((s.id, keeper, since));
            }
        }
        Ok((self.grant_lease(ttl, op).await?, None, since))
    }

    /// Read every key of the name and check the total.
    async fn sem_view(&self, n: &Names, req: &PermitRequest, op: &'static str) -> Result<View> {
        let (base, end) = (n.base.clone(), n.end.clone());
        let mut resp = self
            .call(op, |mut c| {
                let (k, e) = (base.clone(), end.clone());
                async move { c.get(k, Some(GetOptions::new().with_range(e))).await }
            })
            .await?;
        let mut held = 0u32;
        let mut waiters = Vec::new();
        let (mut mine, mut my_place) = (None, None);
        let mut taken = std::collections::HashSet::new();
        for kv in resp.take_kvs() {
            if let Some(i) = kv.key()[n.base.len()..].strip_prefix(b"s/") {
                taken.extend(
                    std::str::from_utf8(i)
                        .ok()
                        .and_then(|i| i.parse::<u32>().ok()),
                );
                continue;
            }
            let (permits, total) =
                parse(kv.value()).ok_or_else(|| corrupt(op, "a semaphore key's value"))?;
            if total != req.total {
                return Err(mismatch(req.total, total));
            }
            let rest = &kv.key()[n.base.len()..];
            if rest.starts_with(b"h/") {
                held = held.saturating_add(permits);
                if kv.key() == n.hold {
                    mine = Some(kv);
                }
            } else {
                waiters.push((kv.create_revision(), permits));
                if kv.key() == n.wait {
                    my_place = Some(kv);
                }
            }
        }
        let before = my_place
            .as_ref()
            .map_or(i64::MAX, |kv| kv.create_revision());
        let ahead = waiters
            .iter()
            .filter(|(r, _)| *r < before)
            .fold(0u32, |a, (_, p)| a.saturating_add(*p));
        let slots: Vec<u32> = (0..req.total).filter(|i| !taken.contains(i)).collect();
        Ok(View {
            free: req.total.saturating_sub(held).min(slots.len() as u32),
            mine,
            my_place,
            ahead,
            slots,
        })
    }

    /// The owner's waiter key is gone with an answered transaction: its
    /// lease (without keys) serves the next key.
    fn sem_place_done(self: &Arc<Self>, sk: &SemKey) {
        if let Some((w, at)) = self.sem_local(sk, |s| s.waiter.take()) {
            self.put_spare(w, QUEUE_ENTRY_TTL.as_secs(), at + QUEUE_ENTRY_TTL, None);
        }
    }

    /// One attempt (see the module docs).
    pub(crate) async fn sem_try_acquire(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
        req: &PermitRequest,
    ) -> Result<Attempt> {
        let op = "semaphore try_acquire";
        let sk: SemKey = (name.into(), *owner.as_bytes());
        let n = self.sem_names(name, owner);
        let value = format!("{} {}", req.permits, req.total).into_bytes();
        let ttl_s = secs(req.ttl);
        // A lease for the grant, once it looks possible: (id, keeper, since).
        let mut lease: Option<(i64, Option<Keeper>, Instant)> = None;
        let mut view = None;
        // The owner's place as the last read saw it.
        let mut seen: Option<KeyValue> = None;
        let spare = |me: &Arc<Self>, l: Option<(i64, Option<Keeper>, Instant)>| {
            if let Some((id, k, since)) = l {
                me.put_spare(id, ttl_s, since + Duration::from_secs(ttl_s), k);
            }
        };
        for _ in 0..CAS_ROUNDS {
            let v = match self.sem_view(&n, req, op).await {
                Ok(v) => v,
                Err(e) => {
                    spare(self, lease);
                    return Err(e);
                }
            };
            seen.clone_from(&v.my_place);
            if let Some(mine) = &v.mine {
                // Ours already (a retry, or a lost reply's write landed):
                // the same grant, refreshed.
                spare(self, lease.take());
                let since = Instant::now();
                if !self.keepalive_once(mine.lease(), op).await? {
                    continue; // gone with its lease just now
                }
                let ttl = self
                    .sem_local(&sk, |s| {
                        s.grant.filter(|g| g.lease == mine.lease()).map(|g| g.ttl)
                    })
                    .unwrap_or(ttl_s);
                self.sem_local(&sk, |s| {
                    s.grant = Some(Grant {
                        lease: mine.lease(),
                        ttl,
                        deadline: since + Duration::from_secs(ttl),
                    });
                    s.slots = slots_of(mine.value());
                });
                self.sem_place_done(&sk);
                return Ok(Attempt::Granted(
                    FencingToken(mine.create_revision() as u64),
                ));
            }
            if v.ahead.saturating_add(req.permits) > v.free {
                view = Some(v);
                break;
            }
            if lease.is_none() {
                lease = Some(self.sem_lease(ttl_s, op).await?);
            }
            let l = lease.as_ref().map_or(0, |l| l.0);
            // The free slots after those the waiters ahead will take: a
            // concurrent grant (taking other slots) does not conflict.
            let at = v.ahead as usize;
            let chosen = v.slots[at..at + req.permits as usize].to_vec();
            let txn = self.sem_grant_txn(&n, &value, &chosen, l, owner);
            let resp = match self.txn(op, txn).await {
                Ok(r) => r,
                Err(e) if is_lease_not_found(&e) => {
                    lease = None;
                    continue;
                }
                Err(e) => {
                    // Maybe applied: remembered, so that a release (or the
                    // next attempt, which finds the key) settles it.
                    let since = lease.map_or_else(Instant::now, |l| l.2);
                    let old = self.sem_local(&sk, |s| {
                        s.keeper = None;
                        s.slots = chosen;
                        s.grant.replace(Grant {
                            lease: l,
                            ttl: ttl_s,
                            deadline: since + Duration::from_secs(ttl_s),
                        })
                    });
                    if let Some(old) = old.filter(|o| o.lease != l) {
                        self.revoke_later(old.lease);
                    }
                    return Err(e);
                }
            };
            if resp.succeeded() {
                let token = header_rev(&resp);
                let (_, keeper, since) = lease.take().expect("a lease was taken");
                let old = self.sem_local(&sk, |s| {
                    s.keeper = keeper;
                    s.slots = chosen;
                    s.grant.replace(Grant {
                        lease: l,
                        ttl: ttl_s,
                        deadline: since + Duration::from_secs(ttl_s),
                    })
                });
                // A lost reply's lease whose write did not land.
                if let Some(o) = old.filter(|o| o.lease != l) {
                    self.revoke_later(o.lease);
                }
                self.sem_place_done(&sk);
                return Ok(Attempt::Granted(FencingToken(token as u64)));
            }
        }
        spare(self, lease);
        if !req.queue {
            return Ok(Attempt::Held { expires_in: None });
        }
        self.sem_keep_place(&sk, &n, &value, seen.as_ref()).await?;
        let expires_in = match view {
            Some(_) => QUEUE_REFRESH,
            // Lost every compare-and-swap to other grants: again soon.
            None => Duration::from_millis(20),
        };
        Ok(Attempt::Held {
            expires_in: Some(expires_in),
        })
    }

    /// The grant: the owner's `h/` key (permits, total, slots) and one key
    /// per slot, all on `lease`, iff those slots are free and the owner has
    /// no grant; the owner's place in the queue goes.
    fn sem_grant_txn(
        &self,
        n: &Names,
        value: &[u8],
        slots: &[u32],
        lease: i64,
        owner: &OwnerToken,
    ) -> Txn {
        let list: Vec<String> = slots.iter().map(u32::to_string).collect();
        let mut v = value.to_vec();
        v.extend_from_slice(format!(" {}", list.join(",")).as_bytes());
        let put =
            |k: Vec<u8>, v: Vec<u8>| TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease)));
        let mut when = vec![Compare::create_revision(
            n.hold.clone(),
            CompareOp::Equal,
            0,
        )];
        let mut then = vec![put(n.hold.clone(), v), TxnOp::delete(n.wait.clone(), None)];
        for i in slots {
            when.push(Compare::create_revision(n.slot(*i), CompareOp::Equal, 0));
            then.push(put(n.slot(*i), owner.to_hex().into_bytes()));
        }
        Txn::new().when(when).and_then(then)
    }

    /// Join the queue, or renew the owner's place in it.
    async fn sem_keep_place(
        self: &Arc<Self>,
        sk: &SemKey,
        n: &Names,
        value: &[u8],
        place: Option<&KeyValue>,
    ) -> Result<()> {
        let op = "semaphore queue";
        let ttl = QUEUE_ENTRY_TTL.as_secs();
        if let Some(kv) = place {
            let now = Instant::now();
            let fresh = self.sem_local(sk, |s| {
                s.waiter
                    .is_some_and(|(l, at)| l == kv.lease() && at + RENEW_AFTER > now)
            });
            if fresh {
                return Ok(());
            }
            if self.keepalive_once(kv.lease(), op).await? {
                let old = self.sem_local(sk, |s| s.waiter.replace((kv.lease(), now)));
                if let Some((o, _)) = old.filter(|o| o.0 != kv.lease()) {
                    self.revoke_later(o);
                }
                return Ok(());
            }
            // The place lapsed with its lease: queue again, at the back.
        }
        let (lease, _, since) = self.sem_lease(ttl, op).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                n.wait.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                n.wait.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        // Recorded first: a release revokes it even if the reply is lost.
        let old = self.sem_local(sk, |s| s.waiter.replace((lease, since)));
        let resp = self.txn(op, txn).await;
        if let Ok(r) = &resp {
            if !r.succeeded() {
                // Our place exists already (a lost reply's write landed):
                // keep that one, and its lease.
                self.sem_local(sk, |s| s.waiter = old);
                self.put_spare(lease, ttl, since + QUEUE_ENTRY_TTL, None);
                return Ok(());
            }
        }
        // The old lease (if any) carried no place: it lapsed or never was.
        if let Some((o, _)) = old {
            self.revoke_later(o);
        }
        resp.map(|_| ())
    }
}

/// FIFO semaphores on etcd (see the crate docs): grants in arrival order
/// of the queued waiters, woken by a watch on the name.
#[async_trait]
impl coord_core::Semaphore for EtcdBackend {
    fn capabilities(&self) -> &coord_core::Capabilities {
        &self.shared.caps
    }

    fn fifo(&self) -> bool {
        true
    }

    /// A grant writes one slot key per permit in one transaction, and etcd
    /// takes at most 128 operations per transaction by default
    /// (`--max-txn-ops`): at most 64 permits per request.
    fn max_permits_per_request(&self) -> u32 {
        64
    }

    async fn try_acquire(
        &self,
        name: &str,
        owner: &OwnerToken,
        request: &PermitRequest,
    ) -> Result<Attempt> {
        self.shared.sem_try_acquire(name, owner, request).await
    }

    async fn release(&self, name: &str, owner: &OwnerToken) -> Result<bool> {
        self.shared.sem_release(name, owner).await
    }

    async fn extend(&self, name: &str, owner: &OwnerToken, ttl: Duration) -> Result<bool> {
        self.shared.sem_extend(name, owner, ttl).await
    }

    async fn force_release(&self, name: &str) -> Result<bool> {
        self.shared.sem_force_release(name).await
    }

    async fn subscribe(&self, name: &str, owner: &OwnerToken) -> Result<Waiter> {
        self.shared.subscribe_sem(name, owner).await
    }
}
