//! Claims (locks and elections): one key per holder or waiter, each on an
//! etcd lease of its own whose TTL is the claim's, so the server enforces
//! every TTL and a key nobody renews expires by itself.
//!
//! A claim's key is named by the lease its first attempt wrote on
//! (`keys::claim_key`), not by its owner: a lease serves one claim at a
//! time and is handed on as a spare only once its key was deleted, so two
//! live claims never share a key, and the next claim on the spare writes
//! the same key again. A busy name thus reuses a few keys rather than
//! leaving one per acquire in etcd's key index until a compaction
//! (tests/it/key_history.rs). The owner is in the value. An attempt retried
//! after a lost reply keeps its claim's key (on a new lease): whether the
//! lost write landed is read from that key, as before.

use std::sync::Arc;
use std::time::Duration;

use coord_core::util::Kind;
use coord_core::{Attempt, Error, OwnerToken, Result};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use tokio::time::Instant;

use crate::claim::Claims;
use crate::claim::entries::{Entry, EntryState, entry_key};
use crate::claim::handoff::is_head;
use crate::client::keys::{BACKEND, claim_key, claim_value, prefix_end, split_lease_value};
use crate::client::pool::fresh_enough;
use crate::client::{header_rev, is_lease_not_found, kvs, lock, secs};

/// The lease of an earlier attempt of the owner whose write went
/// unanswered (it may still land), replaced in the owner's record by this
/// attempt's lease. It is revoked when this goes, unless [`Replaced::keep`]
/// (the record holds it again, or the write landed and is adopted): an
/// attempt that ends without an answer (an error, a cancellation) never
/// leaves a lease that a late write may land on recorded nowhere, where no
/// release would revoke it.
struct Replaced<'a> {
    etcd: &'a Arc<crate::client::Etcd>,
    lease: Option<i64>,
}

impl Replaced<'_> {
    fn keep(&mut self) {
        self.lease = None;
    }
}

impl Drop for Replaced<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.lease.take() {
            self.etcd.revoke_later(l);
        }
    }
}

/// The retryable error of an attempt whose lease was gone before its write
/// took effect: nothing of it is left.
fn lease_gone(op: &'static str) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        operation: op,
        message: "the lease of this attempt expired before its write took effect; nothing \
                  was written, the attempt can be retried"
            .into(),
        source: None,
    }
}

/// What is claimed, and how: the kind, the value stored in the key
/// (elections: the candidate), whether waiters queue (FIFO locks), and the
/// operation's name for errors.
#[derive(Clone, Copy)]
pub(crate) struct ClaimSpec<'a> {
    pub(crate) kind: Kind,
    pub(crate) value: &'a [u8],
    pub(crate) fair: bool,
    pub(crate) op: &'static str,
}

pub(crate) fn first_sorted(key: &[u8], end: &[u8], order: SortOrder, limit: i64) -> TxnOp {
    TxnOp::get(
        key.to_vec(),
        Some(
            GetOptions::new()
                .with_range(end.to_vec())
                .with_sort(SortTarget::Create, order)
                .with_limit(limit),
        ),
    )
}

/// The key created just before `rev` in the queue.
fn pred_of(queue: &[u8], end: &[u8], rev: i64) -> TxnOp {
    TxnOp::get(
        queue.to_vec(),
        Some(
            GetOptions::new()
                .with_range(end.to_vec())
                .with_max_create_revision(rev - 1)
                .with_sort(SortTarget::Create, SortOrder::Descend)
                .with_limit(1),
        ),
    )
}

/// What this client knows of an owner's claim before an attempt.
enum Known {
    /// Nothing written that we know of.
    Fresh,
    /// Our key `key` exists with this create revision on this lease.
    Key {
        key: Vec<u8>,
        rev: i64,
        lease: i64,
        ttl: u64,
    },
}

impl Claims {
    /// One attempt at a claim. A fair claim (lock) queues a key only on the
    /// owner's attempt after a refused or failed one (a waiter's:
    /// coord-core's wait loop attempts, subscribes, then attempts again, and
    /// repeats a failed attempt only inside a wait); a first or one-shot
    /// attempt writes only into an empty queue, so a refused one leaves
    /// nothing behind. After the client's other calls on the claim
    /// ([`Claims::one_call`]).
    pub(crate) async fn try_claim(
        self: &Arc<Self>,
        spec: ClaimSpec<'_>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let _turn = self.one_call(&entry_key(spec.kind, name, owner)).await;
        let r = self.attempt_claim(spec, name, owner, ttl).await;
        if r.is_err() && spec.fair {
            // The failed attempt may have been the one that was to queue
            // (or the first): the next one queues, or the waiter is never
            // woken by the store and sleeps until its deadline.
            self.remember_tried(entry_key(spec.kind, name, owner));
        }
        r
    }

    async fn attempt_claim(
        self: &Arc<Self>,
        spec: ClaimSpec<'_>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Attempt> {
        let ClaimSpec {
            kind,
            value,
            fair,
            op,
        } = spec;
        let start = Instant::now();
        let ek = entry_key(kind, name, owner);
        let queue = self.etcd.keys.queue(kind, name);
        let end = prefix_end(&queue);
        let hex = owner.to_hex();
        let value = claim_value(&hex, value);
        let ttl_s = secs(ttl);

        let expired = {
            let mut entries = lock(&self.entries);
            match entries.get(&ek) {
                Some(Entry {
                    state: EntryState::Held { deadline },
                    ..
                }) if *deadline <= start => entries.remove(&ek),
                _ => None,
            }
        };
        if let Some(e) = expired {
            // Ended locally: make sure the server agrees before starting anew.
            self.etcd.revoke(e.lease, op).await?;
        }
        let mut known = match lock(&self.entries).get(&ek) {
            Some(Entry {
                state: EntryState::Pending,
                ..
            })
            | None => Known::Fresh,
            Some(e) => Known::Key {
                key: e.key.clone(),
                rev: e.rev,
                lease: e.lease,
                ttl: e.lease_ttl,
            },
        };
        let mut use_spare = true;
        for _ in 0..3 {
            match known {
                Known::Fresh => {
                    let queue_mode = fair && self.take_tried(&ek);
                    // A spare lease (refreshed alongside the write), or a
                    // new one.
                    let spare = if use_spare {
                        self.etcd.take_spare(ttl_s)
                    } else {
                        None
                    };
                    // A spare refreshed within the slack needs no
                    // keepalive: the claim's basis is its `fresh_until`.
                    let basis = spare
                        .as_ref()
                        .map(|s| s.fresh_until)
                        .filter(|f| fresh_enough(*f, start, ttl));
                    let reused = spare.is_some() && basis.is_none();
                    let (lease, keeper) = match spare {
                        Some(s) => (s.id, s.keeper),
                        None => (self.etcd.grant_lease(ttl_s, op).await?, None),
                    };
                    let deadline = basis.unwrap_or(start + ttl);
                    // The claim's key: a retry after a lost reply keeps
                    // the key of the attempt whose write may have landed
                    // (its lease is never a spare: it is revoked or
                    // adopted below); otherwise named by this lease.
                    let key = match lock(&self.entries).get(&ek) {
                        Some(e) => e.key.clone(),
                        None => claim_key(&queue, lease),
                    };
                    // Recorded before the write is sent: a release (or the
                    // cleanup of a cancelled acquire) revokes the lease, so a
                    // write applied late fails or dies with it.
                    let old = lock(&self.entries).insert(
                        ek.clone(),
                        Entry {
                            key: key.clone(),
                            rev: 0,
                            lease,
                            lease_ttl: ttl_s,
                            keeper: None,
                            state: EntryState::Pending,
                        },
                    );
                    // A lost reply's lease: kept until we know whether its
                    // write landed, and revoked if this attempt ends
                    // without knowing (see `Replaced`).
                    let mut replaced = Replaced {
                        etcd: &self.etcd,
                        lease: old.as_ref().map(|o| o.lease),
                    };
                    let put = TxnOp::put(
                        key.clone(),
                        value.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    );
                    let txn = if queue_mode {
                        Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([
                                put,
                                first_sorted(&queue, &end, SortOrder::Ascend, 1),
                                first_sorted(&queue, &end, SortOrder::Descend, 2),
                            ])
                    } else {
                        Txn::new()
                            .when([Compare::version(queue.clone(), CompareOp::Equal, 0)
                                .with_range(end.clone())])
                            .and_then([put])
                    }
                    .or_else([
                        TxnOp::get(key.clone(), None),
                        first_sorted(&queue, &end, SortOrder::Ascend, 1),
                    ]);
                    // A spare's keepalive, sent after this attempt began,
                    // makes it live the claim's TTL from then on (a new
                    // lease does from its grant).
                    let (resp, alive) = if reused {
                        tokio::join!(self.etcd.txn(op, txn), self.etcd.refresh(lease, keeper, op))
                    } else {
                        (self.etcd.txn(op, txn).await, Ok((true, keeper)))
                    };
                    let resp = match resp {
                        Ok(r) => r,
                        Err(e) if is_lease_not_found(&e) && (reused || basis.is_some()) => {
                            // The spare ran out (it carried no keys):
                            // nothing was written. Again, on a new lease.
                            let mut entries = lock(&self.entries);
                            match old {
                                Some(o) => {
                                    // Recorded again: the record keeps it.
                                    replaced.keep();
                                    entries.insert(ek.clone(), o)
                                }
                                None => entries.remove(&ek),
                            };
                            drop(entries);
                            if queue_mode {
                                self.remember_tried(ek.clone());
                            }
                            use_spare = false;
                            continue;
                        }
                        Err(e) if is_lease_not_found(&e) => {
                            // The lease just granted is gone (it cannot
                            // have been used): nothing was written. Retry.
                            self.drop_entry(&ek);
                            return Err(lease_gone(op));
                        }
                        Err(e) => return Err(e),
                    };
                    let (alive, keeper) = alive?;
                    if resp.succeeded() && !alive {
                        // The spare ran out just after the write: the key
                        // dies with it.
                        self.drop_entry(&ek);
                        return Err(lease_gone(op));
                    }
                    let mine = kvs(&resp, 0)
                        .into_iter()
                        .next()
                        .filter(|_| !resp.succeeded());
                    // The lost reply's write landed on its lease: adopted
                    // below. Otherwise that lease carries nothing (this
                    // answered transaction read the key): revoked now.
                    if mine
                        .as_ref()
                        .is_some_and(|m| Some(m.lease()) == replaced.lease)
                    {
                        replaced.keep();
                    }
                    drop(replaced);
                    if resp.succeeded() {
                        let rev = header_rev(&resp);
                        let head = kvs(&resp, 1).into_iter().next();
                        if !queue_mode || head.as_ref().is_some_and(|h| h.key() == key) {
                            return Ok(self.set_held(&ek, rev, lease, deadline, keeper));
                        }
                        let pred = kvs(&resp, 2).into_iter().nth(1);
                        let pred_head = is_head(head.as_ref(), pred.as_ref());
                        let pred = pred.map(|p| (p.key().to_vec(), p.create_revision()));
                        self.set_queued(&ek, rev, pred, pred_head, deadline);
                        return Ok(Attempt::Held { expires_in: None });
                    }
                    match mine {
                        Some(mine) => {
                            // Ours already (a lost reply's write landed):
                            // adopt that key, drop the new lease. Its lease
                            // has the TTL of the attempt that wrote it, which
                            // may not be this one's (0: unknown); a lease of
                            // another TTL is not kept (see below).
                            self.etcd.revoke_later(lease);
                            let mine_ttl = old
                                .as_ref()
                                .filter(|o| o.lease == mine.lease())
                                .map_or(0, |o| o.lease_ttl);
                            let e = Entry {
                                key: key.clone(),
                                rev: mine.create_revision(),
                                lease: mine.lease(),
                                lease_ttl: mine_ttl,
                                keeper: None,
                                state: EntryState::Pending,
                            };
                            lock(&self.entries).insert(ek.clone(), e);
                            known = Known::Key {
                                key: key.clone(),
                                rev: mine.create_revision(),
                                lease: mine.lease(),
                                ttl: mine_ttl,
                            };
                        }
                        None => {
                            // Refused, nothing written: the lease (whose
                            // write was answered) serves the next claim.
                            if alive {
                                if let Some(e) = lock(&self.entries).remove(&ek) {
                                    self.etcd.put_spare(e.lease, ttl_s, deadline, keeper);
                                }
                            } else {
                                self.drop_entry(&ek);
                            }
                            let head = kvs(&resp, 1).into_iter().next();
                            // Held by this very owner through another
                            // client (a raw-trait retry there): answered
                            // `Held` (the claim is bound to that client's
                            // lease), and never queued behind itself.
                            let own = head
                                .as_ref()
                                .is_some_and(|h| split_lease_value(h.value()).0 == hex.as_bytes());
                            if fair && !own {
                                self.remember_tried(ek.clone());
                            }
                            return Ok(Attempt::Held {
                                expires_in: self.remaining_of_local(head.as_ref()),
                            });
                        }
                    }
                }
                Known::Key {
                    key,
                    rev,
                    lease,
                    ttl: lease_ttl,
                } => {
                    if lease_ttl == ttl_s {
                        let ids = (rev, lease);
                        if let Some(a) = self.handoff_grant(&ek, &key, ids, start, ttl, op).await? {
                            return Ok(a);
                        }
                    }
                    let txn = Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
                        .and_then([
                            first_sorted(&queue, &end, SortOrder::Ascend, 1),
                            pred_of(&queue, &end, rev),
                        ]);
                    // The keepalive, sent after this attempt began, makes the
                    // key live its TTL from then on if the lease still lives.
                    let (resp, alive) =
                        tokio::join!(self.etcd.txn(op, txn), self.etcd.keepalive_once(lease, op));
                    let resp = resp?;
                    let alive = alive?;
                    let head = kvs(&resp, 0).into_iter().next();
                    let on_lease = head
                        .as_ref()
                        .is_none_or(|h| h.key() != key || h.lease() == lease);
                    let holds = head.as_ref().is_some_and(|h| h.key() == key);
                    if resp.succeeded() && alive && on_lease && holds && lease_ttl != ttl_s {
                        // Held already, on a lease of another TTL (or an
                        // unknown one: adopted): moved onto a lease of this
                        // TTL as an extend does, keeping its create
                        // revision, so the holder keeps its token and
                        // nobody else can take the name meanwhile
                        // (tests/it/same_owner_one_client.rs). Gone meanwhile:
                        // start again, below.
                        let deadline = start + ttl;
                        if matches!(
                            self.set_held(&ek, rev, lease, deadline, None),
                            Attempt::Granted(_)
                        ) && self.extend_claim_now(kind, name, owner, ttl, op).await?
                        {
                            self.head_marker(&ek, &key, rev);
                            return Ok(Attempt::Granted(coord_core::FencingToken(rev as u64)));
                        }
                    }
                    if !resp.succeeded() || !alive || !on_lease || lease_ttl != ttl_s {
                        // Our key is gone (its lease expired, or it was
                        // removed), or its lease has another TTL than this
                        // attempt's (it would keep the key longer or
                        // shorter, and serve later claims of this TTL as a
                        // spare): start again; a waiter queues again.
                        let was_queued = matches!(
                            lock(&self.entries).get(&ek),
                            Some(Entry {
                                state: EntryState::Queued(_),
                                ..
                            })
                        );
                        self.drop_entry(&ek);
                        if was_queued {
                            self.remember_tried(ek.clone());
                        }
                        known = Known::Fresh;
                        continue;
                    }
                    if head.as_ref().is_some_and(|h| h.key() == key) {
                        let a = self.set_held(&ek, rev, lease, start + ttl, None);
                        if matches!(a, Attempt::Granted(_)) {
                            self.head_marker(&ek, &key, rev);
                        }
                        return Ok(a);
                    }
                    let pred = kvs(&resp, 1).into_iter().next();
                    let pred_head = is_head(head.as_ref(), pred.as_ref());
                    let pred = pred.map(|p| (p.key().to_vec(), p.create_revision()));
                    self.set_queued(&ek, rev, pred, pred_head, start + ttl);
                    return Ok(Attempt::Held { expires_in: None });
                }
            }
        }
        Ok(Attempt::Held { expires_in: None })
    }
}
