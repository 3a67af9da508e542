//! Spare leases: the lease of a claim that ended cleanly (its key deleted
//! by an answered, owner-checked transaction, every write on it answered)
//! carries no keys, so it can serve the next claim of the same TTL
//! instead of a grant now and a revocation later. Still one lease per
//! claim: a spare serves one claim at a time. A lease this client sent a
//! revocation for is never a spare until etcd answered it (whoever offers
//! it: a key a dropped call wrote on it may have been deleted since, but
//! the revocation still lands).
//!
//! A spare whose last answered keepalive (or grant) was sent within the
//! [`reuse_slack`] of the attempt's start serves it as it is: the claim's
//! validity basis is then that keepalive's send instant (the spare's
//! `fresh_until`), not the attempt's start, so the claim gives up at most
//! the slack. An older spare is reused only with a keepalive sent after
//! the attempt began (on the keepalive stream kept open with it), so the
//! server keeps the new claim's key at least the claim's TTL, as with a
//! fresh grant. Spares
//! are never kept alive while idle: one left unused expires by itself, and
//! one idle for [`IDLE_GRACE`] is revoked, so an idle client holds no
//! leases beyond that grace.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use coord_core::Result;
use coord_core::util::bounded;
use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};
use tokio::time::{Instant, sleep};

use crate::client::keys::BACKEND;
use crate::client::{Etcd, lock};

/// How long a spare lease may stay unused before it is revoked.
pub(crate) const IDLE_GRACE: Duration = Duration::from_secs(5);

/// At most this many spares are kept per TTL; more are revoked.
const MAX_SPARES: usize = 256;

/// A lease's keepalive stream, kept open so that the next keepalive is one
/// message, not a new stream.
pub(crate) struct Keeper {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

/// How much validity a claim may give up to skip the keepalive of a
/// spare: a fortieth of the TTL, half the drift margin, at most 50 ms. A
/// guard counts its validity from before the attempt (coord-core), so a
/// claim on a spare refreshed at most this long before its start keeps at
/// least half the drift margin before the server's expiry.
pub(crate) fn reuse_slack(ttl: Duration) -> Duration {
    (ttl / 40)
        .min(coord_core::drift(ttl) / 2)
        .min(Duration::from_millis(50))
}

/// Whether a lease the server keeps until `fresh_until` can carry a claim
/// of `ttl` begun at `start` without a keepalive: it gives up at most the
/// [`reuse_slack`]. The one rule for spares and for queued waiters.
pub(crate) fn fresh_enough(fresh_until: Instant, start: Instant, ttl: Duration) -> bool {
    fresh_until + reuse_slack(ttl) >= start + ttl
}

/// A lease without keys, ready for the next claim of its TTL.
pub(crate) struct Spare {
    pub(crate) id: i64,
    /// The server keeps it at least until then: the send instant of its
    /// last answered keepalive or grant, plus its TTL.
    pub(crate) fresh_until: Instant,
    idle_since: Instant,
    pub(crate) keeper: Option<Keeper>,
}

/// The spare leases of one client, by TTL in seconds.
#[derive(Default)]
pub(crate) struct Pool {
    spares: HashMap<u64, Vec<Spare>>,
    sweeping: bool,
    /// Leases whose revocation this client sent and etcd has not
    /// answered yet ([`Etcd::revoke_later`]): never a spare, whoever
    /// offers one, or the revocation landing later would take the next
    /// claim's keys with it.
    revoking: HashSet<i64>,
}

impl Pool {
    fn len(&self) -> usize {
        self.spares.values().map(Vec::len).sum()
    }
}

impl Etcd {
    /// A spare lease of `ttl` seconds that the server keeps at least half
    /// its TTL more (so a keepalive sent now surely finds it), if any.
    pub(crate) fn take_spare(&self, ttl: u64) -> Option<Spare> {
        let need = Instant::now() + Duration::from_secs(ttl) / 2;
        let mut pool = lock(&self.pool);
        let list = pool.spares.get_mut(&ttl)?;
        // The most recently used first; older ones that ran low are left
        // to expire by themselves (they carry no keys).
        while let Some(s) = list.pop() {
            if s.fresh_until >= need {
                return Some(s);
            }
        }
        None
    }

    /// Keep lease `id` (of `ttl` seconds, without keys, that the server
    /// keeps at least until `fresh_until`) for the next claim.
    pub(crate) fn put_spare(
        self: &Arc<Self>,
        id: i64,
        ttl: u64,
        fresh_until: Instant,
        keeper: Option<Keeper>,
    ) {
        let now = Instant::now();
        if fresh_until <= now {
            self.revoke_later(id);
            return;
        }
        let (evicted, start_sweeper) = {
            let mut pool = lock(&self.pool);
            if pool.revoking.contains(&id) {
                // Being revoked: it dies with its revocation.
                return;
            }
            let list = pool.spares.entry(ttl).or_default();
            list.push(Spare {
                id,
                fresh_until,
                idle_since: now,
                keeper,
            });
            let evicted = (list.len() > MAX_SPARES).then(|| list.remove(0).id);
            let start = !pool.sweeping;
            pool.sweeping = true;
            (evicted, start)
        };
        if let Some(old) = evicted {
            self.revoke_later(old);
        }
        if start_sweeper {
            self.spawn_sweeper();
        }
    }

    /// Mark lease `id` as being revoked: out of the pool, and kept out
    /// until [`Self::revoke_answered`].
    pub(crate) fn revoke_sent(&self, id: i64) {
        let mut pool = lock(&self.pool);
        pool.revoking.insert(id);
        for list in pool.spares.values_mut() {
            list.retain(|s| s.id != id);
        }
    }

    /// Etcd answered the revocation of lease `id`: the lease is gone, and
    /// nothing can write on it any more.
    pub(crate) fn revoke_answered(&self, id: i64) {
        lock(&self.pool).revoking.remove(&id);
    }

    /// Revoke spares idle for [`IDLE_GRACE`]; ends when none are left.
    fn spawn_sweeper(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            lock(&self.pool).sweeping = false;
            return;
        };
        let shared = self.clone();
        rt.spawn(async move {
            let mut shutdown = shared.shutdown.clone();
            loop {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = sleep(IDLE_GRACE / 2) => {}
                }
                let now = Instant::now();
                let idle: Vec<(i64, Instant)> = {
                    let mut pool = lock(&shared.pool);
                    let mut idle = Vec::new();
                    for list in pool.spares.values_mut() {
                        list.retain(|s| {
                            let keep = s.idle_since + IDLE_GRACE > now;
                            if !keep {
                                idle.push((s.id, s.fresh_until));
                            }
                            keep
                        });
                    }
                    pool.spares.retain(|_, l| !l.is_empty());
                    if pool.len() == 0 {
                        pool.sweeping = false;
                    }
                    idle
                };
                for (id, fresh_until) in &idle {
                    // One that already expired needs nothing.
                    if *fresh_until > now {
                        shared.revoke_later(*id);
                    }
                }
                if !lock(&shared.pool).sweeping {
                    return;
                }
            }
        });
    }

    /// Refresh lease `id` once, on `keeper`'s stream if it has one (else a
    /// new stream): `Ok((true, keeper))` once the server answered with a
    /// positive TTL (the lease then lives its full TTL from the start of
    /// this call), `Ok((false, None))` if the server no longer has it.
    pub(crate) async fn refresh(
        &self,
        id: i64,
        keeper: Option<Keeper>,
        op: &'static str,
    ) -> Result<(bool, Option<Keeper>)> {
        bounded(BACKEND, op, self.timeout, async {
            if let Some(mut k) = keeper {
                if k.keeper.keep_alive().await.is_ok() {
                    if let Ok(Some(r)) = k.stream.message().await {
                        if r.ttl() > 0 {
                            return Ok((true, Some(k)));
                        }
                        // Not found: maybe not applied yet on the leader
                        // (see NOT_FOUND_RETRIES); asked again below.
                    }
                }
                // The stream broke, or the lease was not found: a new one.
            }
            let mut again = crate::client::NOT_FOUND_RETRIES.iter();
            loop {
                match self
                    .call(op, |c| async move { c.lease_client().keep_alive(id).await })
                    .await
                {
                    Ok((keeper, stream)) => return Ok((true, Some(Keeper { keeper, stream }))),
                    Err(e) if crate::client::is_lease_not_found(&e) => match again.next() {
                        Some(ms) => sleep(Duration::from_millis(*ms)).await,
                        None => return Ok((false, None)),
                    },
                    Err(e) => return Err(e),
                }
            }
        })
        .await
    }
}
