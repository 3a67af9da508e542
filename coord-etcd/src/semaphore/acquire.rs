//! Semaphore attempts: the grant transaction (see `semaphore.rs` for the
//! layout; the read of a name and the choice of slots are in
//! `semaphore/view.rs`, a refused waiter's place in the queue in
//! `semaphore/place.rs`).
//!
//! An attempt reads the name in one snapshot: the grant and waiter keys
//! with their values, the slot keys without (keys only), so a read costs
//! what is held and queued, not the total; each range in pages (the
//! first in one transaction, the next at its revision), so no answer
//! grows with the name (`client.rs`: `PAGE`). It is granted only if its
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

use crate::client::keys::BACKEND;
use crate::client::pool::Keeper;
use crate::client::{header_rev, is_compacted, is_lease_not_found, kvs, lock, secs};
use crate::semaphore::Semaphores;
use crate::semaphore::view::{Basis, Dice, View, choose, reads, view_of};
use crate::semaphore::{Grant, Names, QUEUE_REFRESH, SemKey, slots_of};

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
    shared: &'a Arc<Semaphores>,
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
        self.shared.etcd.revoke_later(self.lease);
    }
}

impl Semaphores {
    /// Read the name in one snapshot (in pages at one revision, read
    /// again if that was compacted away between pages) and check the
    /// total.
    async fn sem_view(&self, n: &Names, req: &PermitRequest, op: &'static str) -> Result<View> {
        let mut tries = 0;
        loop {
            let resp = self.etcd.txn(op, Txn::new().and_then(reads(n))).await?;
            match self.sem_lists(n, resp, op).await {
                Ok(lists) => return view_of(n, req, lists, op),
                Err(e) if is_compacted(&e) && tries < 3 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Run `txn`, which writes on `lease` (for a grant: one of
    /// `grant_ttl`, writing key `hold`), revoking the lease if this is
    /// dropped before the call returns (see [`OnItsWay`]).
    pub(crate) async fn sem_txn_on(
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
        let r = self.etcd.txn(op, txn).await;
        on_its_way.returned = true;
        r
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
        // The owner's place as the last read saw it, and what that read's
        // check of the total rests on.
        let mut seen: Option<KeyValue> = None;
        let mut basis = Basis::Idle;
        // The state a lost compare-and-swap returned, to try again with.
        let mut fresh: Option<View> = None;
        let mut dice = Dice::new(owner);
        // An attempt that keeps finding room but losing its slots to other
        // grants makes way for them: this long at most.
        let give_up = Instant::now() + self.etcd.timeout;
        let spare = |me: &Arc<Self>, l: Option<Held>| {
            if let Some((id, k, since)) = l {
                me.etcd
                    .put_spare(id, ttl_s, since + Duration::from_secs(ttl_s), k);
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
            basis.clone_from(&v.basis);
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
                        source: None,
                    });
                }
                let since = Instant::now();
                if !self.etcd.keepalive_once(mine.lease(), op).await? {
                    continue; // gone with its lease just now
                }
                // On the lease this client recorded: its own write landed.
                // On any other: written through another client (the same
                // owner), adopted: acted on at its create revision, its
                // lease never spared nor revoked here, its key never
                // written by this client's grants (`SemLocal::hold`).
                let old = self.sem_local(&sk, |s| {
                    let own = s
                        .grant
                        .as_ref()
                        .filter(|g| g.own && g.lease == mine.lease());
                    let ttl = own.map_or(0, |g| g.ttl);
                    let own = own.is_some();
                    let valid = if own { ttl } else { ttl_s };
                    if !own {
                        s.keeper = None;
                    }
                    s.slots = slots_of(mine.value());
                    s.grant.replace(Grant {
                        lease: mine.lease(),
                        ttl,
                        deadline: since + Duration::from_secs(valid),
                        key: mine.key().to_vec(),
                        rev: mine.create_revision(),
                        own,
                    })
                });
                // A lost reply's lease whose write did not land here.
                if let Some(o) = old.filter(|o| o.own && o.lease != mine.lease()) {
                    self.etcd.revoke_later(o.lease);
                }
                self.sem_place_done(&sk, None, mine.lease());
                // A lease of another TTL than this attempt's (or of an
                // unknown one: adopted) would end the grant earlier or later
                // than the answer says: moved onto a lease of this client's
                // with this TTL first, as an extend does. The extend acts on
                // the owner's live grant: if that is not the one read here
                // (gone, or released and granted again through another
                // client meanwhile), the attempt starts afresh, its next
                // read finding the live grant: a token is only ever
                // answered for a grant that exists (tests/it/semaphore_moving_retry.rs).
                let other_ttl =
                    self.sem_local(&sk, |s| s.grant.as_ref().is_some_and(|g| g.ttl != ttl_s));
                if other_ttl
                    && self.sem_extend(name, owner, req.ttl).await? != Some(mine.create_revision())
                {
                    continue;
                }
                return Ok(Attempt::Granted(
                    FencingToken(mine.create_revision() as u64),
                ));
            }
            if !coord_core::permits::admits(v.free, v.ahead, req.permits) {
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
            let place = match &v.my_place {
                Some(p) => Some((p.key().to_vec(), p.create_revision())),
                None => place.map(|k| (k, 0)),
            };
            let keys = (hold.clone(), place);
            let txn = self.sem_grant_txn(&n, &value, &chosen, l, keys, &v.basis, owner, metadata);
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
                        s.hold = Some(hold.clone());
                        s.grant.replace(Grant {
                            lease: l,
                            ttl: ttl_s,
                            deadline: since + Duration::from_secs(ttl_s),
                            key: hold,
                            rev: 0,
                            own: true,
                        })
                    });
                    if let Some(old) = old.filter(|o| o.own && o.lease != l) {
                        self.etcd.revoke_later(old.lease);
                    }
                    return Err(e);
                }
            };
            if !resp.succeeded() {
                // The name as the failed compare saw it: again with that
                // (read again if its pages' revision is compacted away).
                match self.sem_lists(&n, resp, op).await {
                    Ok(lists) => match view_of(&n, req, lists, op) {
                        Ok(v) => fresh = Some(v),
                        Err(e) => {
                            spare(self, lease);
                            return Err(e);
                        }
                    },
                    Err(e) if is_compacted(&e) => {}
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
                s.hold = Some(hold.clone());
                s.grant.replace(Grant {
                    lease: l,
                    ttl: ttl_s,
                    deadline: since + Duration::from_secs(ttl_s),
                    key: hold,
                    rev: token,
                    own: true,
                })
            });
            // A lost reply's lease whose write did not land.
            if let Some(o) = old.filter(|o| o.own && o.lease != l) {
                self.etcd.revoke_later(o.lease);
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
                        self.etcd.timeout
                    ),
                    source: None,
                });
            }
            return Ok(Attempt::Held { expires_in: None });
        }
        let placed = self
            .sem_keep_place(&sk, &n, &value, seen.as_ref(), &basis)
            .await?;
        let expires_in = if full && placed {
            QUEUE_REFRESH
        } else {
            // Lost every compare-and-swap to other grants, or the name
            // changed under the place's write: again soon.
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
    /// queue `keys.1` goes (its second answer: the place deleted, if any),
    /// compared to have the create revision read (0: a place this client's
    /// write may have queued, unseen: deleted whatever it is, as only this
    /// client writes that key). The total stays the name's: the place
    /// read (it has this total) still lives, or else the read's `basis`
    /// still stands. Otherwise the name is read as
    /// [`reads`] does.
    #[allow(clippy::too_many_arguments)]
    fn sem_grant_txn(
        &self,
        n: &Names,
        value: &[u8],
        slots: &[u32],
        lease: i64,
        keys: (Vec<u8>, Option<(Vec<u8>, i64)>),
        basis: &Basis,
        owner: &OwnerToken,
        metadata: Option<&[u8]>,
    ) -> Txn {
        let (hold, place) = keys;
        let (place, place_rev) = place.unwrap_or_else(|| (n.nothing(), 0));
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
        if place_rev > 0 {
            when.push(Compare::create_revision(
                place.clone(),
                CompareOp::Equal,
                place_rev,
            ));
        } else {
            when.extend(basis.compares(n));
        }
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
}
