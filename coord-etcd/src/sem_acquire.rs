//! Semaphore attempts: the grant transaction and a refused waiter's place
//! in the queue (see `semaphore.rs` for the layout; the read of a name and
//! the choice of slots are in `sem_view.rs`).
//!
//! An attempt reads the name in one snapshot: the grant and waiter keys
//! with their values, the slot keys without (keys only), so a read costs
//! what is held and queued, not the total. It is granted only if its
//! request and every request queued ahead of it fit into the free permits.
//! It then takes slots chosen at random among the free ones (so attempts
//! that read the same state pick different slots; the waiters ahead keep
//! room, as the check left at least their permits free). A grant whose
//! slots were taken meanwhile gets the name's state back from the same
//! transaction (its else branch reads the snapshot again) and tries again
//! with that, for as long as the state shows room: an attempt without a
//! place in the queue is refused only by a state without room, and then
//! writes nothing. One that still finds room but loses its slots to other
//! grants for the call timeout gives up with `Error::Unavailable`, holding
//! nothing (every lost round is another grant made: the name is busy); a
//! queued one keeps its place after a few rounds instead, and tries again
//! soon.
//!
//! Late copies. A transaction the client gave up on (its call timed out,
//! its connection broke, or the attempt was dropped mid-call) may still
//! reach etcd later, after the acquire ended and released: it writes its
//! keys on its lease, and etcd refuses a transaction whose lease is gone.
//! So a lease whose write may still be on its way is never handed on as a
//! spare, and is revoked when its claim ends without it: an unanswered
//! write is recorded (a release, or the next grant, revokes its lease), a
//! grant spares the owner's place lease only if its answered transaction
//! deleted the place on it (else the place's write may be on its way: the
//! lease is revoked), and a transaction dropped before its reply revokes
//! its lease in the background at once (a grant found on that lease
//! meanwhile is not adopted). A late copy then fails, or dies with its
//! lease as soon as the revocation lands; only if every revocation fails
//! (etcd unreachable) does it last, to its lease's TTL.

use std::sync::Arc;
use std::time::Duration;

use coord_core::{Attempt, Error, FencingToken, OwnerToken, PermitRequest, Result};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, KeyValue, PutOptions, Txn, TxnOp, TxnResponse,
};
use tokio::time::Instant;

use crate::backend::{Shared, header_rev, is_lease_not_found, kvs, lock, secs};
use crate::keys::BACKEND;
use crate::pool::Keeper;
use crate::sem_view::{Dice, View, choose, reads, view_of};
use crate::semaphore::{Grant, Names, QUEUE_ENTRY_TTL, QUEUE_REFRESH, SemKey, slots_of};

/// A place is renewed by an attempt at most this often.
const RENEW_AFTER: Duration = Duration::from_secs(5);
/// Rounds (read, compare-and-swap) of a queued attempt before it keeps its
/// place and tries again soon: its place, not this call, keeps its turn.
const QUEUED_ROUNDS: usize = 8;

/// A lease held for a grant: (id, keeper, since).
type Held = (i64, Option<Keeper>, Instant);

/// A transaction writing on `lease`, on its way. Dropped before the call
/// returned (the attempt was cancelled mid-call), it revokes the lease in
/// the background, so the transaction, should it reach etcd later, fails
/// or dies with the lease; a grant's lease is also marked doomed for as
/// long as it could live, so that no attempt adopts a grant on it.
struct OnItsWay<'a> {
    shared: &'a Arc<Shared>,
    sk: &'a SemKey,
    lease: i64,
    /// For a grant: the lease's TTL (it was last refreshed before the
    /// drop).
    grant_ttl: Option<Duration>,
    /// For a grant: its key, recorded at a drop (a write of it may land).
    hold: Option<Vec<u8>>,
    returned: bool,
}

/// Beyond its TTL from its last refresh, how long a lease may still live
/// (a leader change extends every lease by about an election timeout).
const LEASE_SLACK: Duration = Duration::from_secs(2);

impl Drop for OnItsWay<'_> {
    fn drop(&mut self) {
        if self.returned {
            return;
        }
        if let Some(ttl) = self.grant_ttl {
            let until = Instant::now() + ttl + LEASE_SLACK;
            let hold = self.hold.take();
            self.shared.sem_local(self.sk, |s| {
                s.doomed = Some((self.lease, until));
                if s.hold.is_none() {
                    s.hold = hold;
                }
            });
        }
        self.shared.revoke_later(self.lease);
    }
}

impl Shared {
    /// Read the name in one snapshot and check the total.
    async fn sem_view(&self, n: &Names, req: &PermitRequest, op: &'static str) -> Result<View> {
        let resp = self.txn(op, Txn::new().and_then(reads(n))).await?;
        view_of(n, req, resp, op)
    }

    /// Run `txn`, which writes on `lease` (for a grant: one of
    /// `grant_ttl`, writing key `hold`), revoking the lease if this is
    /// dropped before the call returns (see [`OnItsWay`]).
    async fn sem_txn_on(
        self: &Arc<Self>,
        sk: &SemKey,
        lease: i64,
        grant: Option<(Duration, Vec<u8>)>,
        op: &'static str,
        txn: Txn,
    ) -> Result<TxnResponse> {
        let (grant_ttl, hold) = grant.unzip();
        let mut on_its_way = OnItsWay {
            shared: self,
            sk,
            lease,
            grant_ttl,
            hold,
            returned: false,
        };
        let r = self.txn(op, txn).await;
        on_its_way.returned = true;
        r
    }

    /// The owner is granted (on lease `grant`): its place in the queue is
    /// gone. The place's lease serves the next key only if the answered
    /// grant transaction deleted the place on it (`deleted`: the lease of
    /// the place it deleted). Otherwise the place was never seen (its write
    /// went unanswered and may still land) or lapsed: the lease is revoked,
    /// so a late copy of that write fails instead of queueing the owner on
    /// a spare that lives on.
    fn sem_place_done(self: &Arc<Self>, sk: &SemKey, deleted: Option<i64>, grant: i64) {
        let place = self.sem_local(sk, |s| {
            s.place = None;
            s.waiter.take()
        });
        if let Some((w, at)) = place {
            if deleted == Some(w) {
                self.put_spare(w, QUEUE_ENTRY_TTL.as_secs(), at + QUEUE_ENTRY_TTL, None);
            } else if w != grant {
                self.revoke_later(w);
            }
        }
    }

    /// Whether `lease` is a dropped grant transaction's, being revoked.
    fn sem_doomed(&self, sk: &SemKey, lease: i64) -> bool {
        let now = Instant::now();
        lock(&self.sems)
            .get(sk)
            .and_then(|s| s.doomed)
            .is_some_and(|(l, until)| l == lease && until > now)
    }

    /// One attempt (see the module docs). A new grant stores `metadata`
    /// in its `h/` key; a grant the owner has already is kept as it is.
    pub(crate) async fn sem_try_acquire(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
        req: &PermitRequest,
        metadata: Option<&[u8]>,
    ) -> Result<Attempt> {
        let op = "semaphore try_acquire";
        let sk: SemKey = (name.into(), *owner.as_bytes());
        let n = self.sem_names(name, owner);
        let value = format!("{} {} {}", owner.to_hex(), req.permits, req.total).into_bytes();
        let ttl_s = secs(req.ttl);
        // A lease for the grant, once it looks possible.
        let mut lease: Option<Held> = None;
        // Whether the last state read had no room for the request.
        let mut full = false;
        // The owner's place as the last read saw it.
        let mut seen: Option<KeyValue> = None;
        // The state a lost compare-and-swap returned, to try again with.
        let mut fresh: Option<View> = None;
        let mut dice = Dice::new(owner);
        // An attempt that keeps finding room but losing its slots to other
        // grants makes way for them: this long at most.
        let give_up = Instant::now() + self.timeout;
        let spare = |me: &Arc<Self>, l: Option<Held>| {
            if let Some((id, k, since)) = l {
                me.put_spare(id, ttl_s, since + Duration::from_secs(ttl_s), k);
            }
        };
        let mut rounds = 0;
        loop {
            rounds += 1;
            let v = match fresh.take() {
                Some(v) => v,
                None => match self.sem_view(&n, req, op).await {
                    Ok(v) => v,
                    Err(e) => {
                        spare(self, lease);
                        return Err(e);
                    }
                },
            };
            seen.clone_from(&v.my_place);
            if let Some(mine) = &v.mine {
                // Ours already (a retry, or a lost reply's write landed):
                // the same grant, refreshed.
                spare(self, lease.take());
                if self.sem_doomed(&sk, mine.lease()) {
                    // A dropped attempt's write, landed late: it goes with
                    // its lease, being revoked.
                    return Err(Error::Unavailable {
                        backend: BACKEND,
                        operation: op,
                        message: "an earlier attempt of this owner was dropped mid-call; \
                                  the grant it wrote is being revoked"
                            .into(),
                    });
                }
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
                    s.hold = Some(mine.key().to_vec());
                });
                self.sem_place_done(&sk, None, mine.lease());
                return Ok(Attempt::Granted(
                    FencingToken(mine.create_revision() as u64),
                ));
            }
            if v.ahead.saturating_add(req.permits) > v.free {
                full = true;
                break;
            }
            if (req.queue && rounds > QUEUED_ROUNDS) || Instant::now() >= give_up {
                break;
            }
            if lease.is_none() {
                lease = Some(self.sem_lease(ttl_s, op).await?);
            }
            let l = lease.as_ref().map_or(0, |l| l.0);
            let chosen = choose(&v.taken, req.total, req.permits, &mut dice);
            // The grant's key: the one a write of this owner's may have
            // gone to (see `SemLocal::hold`), else named by this lease.
            // Its place: the one read, else the one last written.
            let (hold, place) = self.sem_local(&sk, |s| (s.hold.clone(), s.place.clone()));
            let hold = hold.unwrap_or_else(|| n.hold_on(l));
            let place = v.my_place.as_ref().map(|p| p.key().to_vec()).or(place);
            let keys = (hold.clone(), place);
            let txn = self.sem_grant_txn(&n, &value, &chosen, l, keys, owner, metadata);
            let grant = Some((Duration::from_secs(ttl_s), hold.clone()));
            let resp = match self.sem_txn_on(&sk, l, grant, op, txn).await {
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
                        s.hold = Some(hold);
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
            if !resp.succeeded() {
                // The name as the failed compare saw it: again with that.
                match view_of(&n, req, resp, op) {
                    Ok(v) => fresh = Some(v),
                    Err(e) => {
                        spare(self, lease);
                        return Err(e);
                    }
                }
                continue;
            }
            let token = header_rev(&resp);
            let (_, keeper, since) = lease.take().expect("a lease was taken");
            let old = self.sem_local(&sk, |s| {
                s.keeper = keeper;
                s.slots = chosen;
                s.hold = Some(hold);
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
            let deleted = kvs(&resp, 1).first().map(KeyValue::lease);
            self.sem_place_done(&sk, deleted, l);
            return Ok(Attempt::Granted(FencingToken(token as u64)));
        }
        spare(self, lease);
        if !req.queue {
            if !full {
                return Err(Error::Unavailable {
                    backend: BACKEND,
                    operation: op,
                    message: format!(
                        "permits were free, but other grants took the slots chosen in \
                         every round for {:?}; nothing is held",
                        self.timeout
                    ),
                });
            }
            return Ok(Attempt::Held { expires_in: None });
        }
        self.sem_keep_place(&sk, &n, &value, seen.as_ref()).await?;
        let expires_in = if full {
            QUEUE_REFRESH
        } else {
            // Lost every compare-and-swap to other grants: again soon.
            Duration::from_millis(20)
        };
        Ok(Attempt::Held {
            expires_in: Some(expires_in),
        })
    }

    /// The grant: the owner's `h/` key `keys.0` (owner, permits, total,
    /// slots, metadata) and one key per slot, all on `lease`, iff those
    /// slots are free and that key is absent (a write of this owner's
    /// landing late never makes a second grant); the owner's place in the
    /// queue `keys.1` goes (its second answer: the place deleted, if any).
    /// Otherwise the name is read as [`reads`] does.
    #[allow(clippy::too_many_arguments)]
    fn sem_grant_txn(
        &self,
        n: &Names,
        value: &[u8],
        slots: &[u32],
        lease: i64,
        keys: (Vec<u8>, Option<Vec<u8>>),
        owner: &OwnerToken,
        metadata: Option<&[u8]>,
    ) -> Txn {
        let (hold, place) = keys;
        let place = place.unwrap_or_else(|| n.nothing());
        let list: Vec<String> = slots.iter().map(u32::to_string).collect();
        let mut v = value.to_vec();
        v.extend_from_slice(format!(" {}", list.join(",")).as_bytes());
        if let Some(m) = metadata {
            v.push(b' ');
            v.extend_from_slice(m);
        }
        let put =
            |k: Vec<u8>, v: Vec<u8>| TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease)));
        let mut when = vec![Compare::create_revision(hold.clone(), CompareOp::Equal, 0)];
        let mut then = vec![
            put(hold, v),
            TxnOp::delete(place, Some(DeleteOptions::new().with_prev_key())),
        ];
        for i in slots {
            when.push(Compare::create_revision(n.slot(*i), CompareOp::Equal, 0));
            then.push(put(n.slot(*i), owner.to_hex().into_bytes()));
        }
        Txn::new().when(when).and_then(then).or_else(reads(n))
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
                let old = self.sem_local(sk, |s| {
                    s.place = Some(kv.key().to_vec());
                    s.waiter.replace((kv.lease(), now))
                });
                if let Some((o, _)) = old.filter(|o| o.0 != kv.lease()) {
                    self.revoke_later(o);
                }
                return Ok(());
            }
            // The place lapsed with its lease: queue again, at the back.
        }
        let (lease, _, since) = self.sem_lease(ttl, op).await?;
        // The place's key: the one last written (a write whose reply was
        // lost may land: compared to be absent), else named by this lease.
        // Recorded first, with the lease: a release revokes it even if the
        // reply is lost (and a drop mid-call at once).
        let (old, key) = self.sem_local(sk, |s| {
            let key = s.place.get_or_insert_with(|| n.wait_on(lease)).clone();
            (s.waiter.replace((lease, since)), key)
        });
        let named_here = key == n.wait_on(lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                value.to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let resp = self.sem_txn_on(sk, lease, None, op, txn).await;
        if let Ok(r) = &resp {
            if !r.succeeded() {
                // Our place exists already (a lost reply's write landed):
                // keep that one, and its lease. This lease wrote nothing;
                // one a key is named by is not a spare (never expected: a
                // spare's keys were deleted).
                self.sem_local(sk, |s| s.waiter = old);
                if named_here {
                    self.revoke_later(lease);
                } else {
                    self.put_spare(lease, ttl, since + QUEUE_ENTRY_TTL, None);
                }
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
