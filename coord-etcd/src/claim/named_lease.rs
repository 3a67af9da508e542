//! Named leases: `<prefix>lease/<name>`, valued with the owner's token
//! (then ` <metadata>` for a grant made with metadata: see
//! `client/keys.rs`), attached to an etcd lease of its own (`remaining` is what the server
//! says; `revoke` ends it at once).

use std::sync::Arc;
use std::time::Duration;

use coord_core::util::Kind;
use coord_core::{Attempt, FencingToken, OwnerToken, Result};
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use tokio::time::Instant;

use crate::claim::Claims;
use crate::claim::entries::{Entry, EntryState, entry_key};
use crate::client::keys::{lease_value, split_lease_value};
use crate::client::{header_rev, kvs, lock, secs};

/// How many times a grant moves its owner's key onto its new lease while
/// other grants of that owner keep moving it.
const MOVE_TRIES: usize = 3;

impl Claims {
    /// A grant of a named lease: a live one of the owner's is renewed and
    /// kept as it is (metadata too); a new one stores `metadata`.
    pub(crate) async fn grant_lease_named(
        self: &Arc<Self>,
        name: &str,
        owner: &OwnerToken,
        ttl: Duration,
        metadata: Option<&[u8]>,
    ) -> Result<Attempt> {
        let op = "lease grant";
        let start = Instant::now();
        let shared = self;
        let ek = entry_key(Kind::Lease, name, owner);
        let _turn = shared.one_call(&ek).await;
        let live = lock(&shared.entries).get(&ek).and_then(|e| match e.state {
            EntryState::Held { deadline } if deadline > start => Some(e.rev),
            _ => None,
        });
        if let Some(rev) = live {
            let renew = "lease renew";
            if (shared.extend_claim_now(Kind::Lease, name, owner, ttl, renew)).await? {
                return Ok(Attempt::Granted(FencingToken(rev as u64)));
            }
        }
        shared.drop_entry(&ek);
        let key = shared.etcd.keys.single(Kind::Lease, name);
        let hex = owner.to_hex();
        let ttl_s = secs(ttl);
        let id = shared.etcd.grant_lease(ttl_s, op).await?;
        let entry = |rev: i64, lease: i64| Entry {
            key: key.clone(),
            rev,
            lease,
            lease_ttl: ttl_s,
            keeper: None,
            state: EntryState::Held {
                deadline: start + ttl,
            },
        };
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                lease_value(&hex, metadata),
                Some(PutOptions::new().with_lease(id)),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = shared
            .etcd
            .txn(op, txn)
            .await
            .inspect_err(|_| shared.etcd.revoke_later(id))?;
        if resp.succeeded() {
            let rev = header_rev(&resp);
            let mut entries = lock(&shared.entries);
            entries.insert(ek, entry(rev, id));
            shared.prune(&mut entries);
            return Ok(Attempt::Granted(FencingToken(rev as u64)));
        }
        let Some(kv) = kvs(&resp, 0).into_iter().next() else {
            shared.etcd.revoke_later(id);
            return Ok(Attempt::Held { expires_in: None });
        };
        if split_lease_value(kv.value()).0 == hex.as_bytes() {
            // Ours already: a retry after a lost reply, or the same owner
            // granted through another client. The key moves (same create
            // revision, value and token) onto the lease just granted, so
            // this client never keeps, pools or revokes a lease it did not
            // create: another client's lease becomes a spare carrying its
            // next claim once released there (tests/it/cross_client_owner.rs).
            // The other client's renewals then find the key off their lease.
            // The move compares the lease it read the key on too, as an
            // extend's move does: one whose answer never came, landing
            // after a later grant of the owner moved the key again, fails
            // instead of putting it back on this older lease, which
            // nobody keeps alive and which would end that later grant early.
            // A move refused because another grant of the owner moved the
            // key meanwhile (the same key: its create revision) is made
            // again from where the key is now.
            let mut on = kv.lease();
            for _ in 0..MOVE_TRIES {
                let txn = Txn::new()
                    .when([
                        Compare::create_revision(
                            key.clone(),
                            CompareOp::Equal,
                            kv.create_revision(),
                        ),
                        Compare::lease(key.clone(), CompareOp::Equal, on),
                    ])
                    .and_then([TxnOp::put(
                        key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(id).with_ignore_value()),
                    )])
                    .or_else([TxnOp::get(key.clone(), None)]);
                // On an error the move may have landed: the lease just
                // granted may carry the owner's live key now, so it is not
                // revoked (it ends at its TTL, nobody keeping it alive,
                // like the claim).
                let moved = shared.etcd.txn(op, txn).await?;
                if moved.succeeded() {
                    let mut entries = lock(&shared.entries);
                    entries.insert(ek, entry(kv.create_revision(), id));
                    shared.prune(&mut entries);
                    return Ok(Attempt::Granted(FencingToken(kv.create_revision() as u64)));
                }
                match kvs(&moved, 0).into_iter().next() {
                    Some(now) if now.create_revision() == kv.create_revision() => {
                        on = now.lease();
                    }
                    _ => break,
                }
            }
            shared.etcd.revoke_later(id);
            return Ok(Attempt::Held { expires_in: None });
        }
        shared.etcd.revoke_later(id);
        let ttl_left = shared
            .etcd
            .call(op, |mut c| {
                let id = kv.lease();
                async move { c.lease_time_to_live(id, None).await }
            })
            .await
            .ok()
            .and_then(|r| u64::try_from(r.ttl()).ok())
            .map(Duration::from_secs);
        Ok(Attempt::Held {
            expires_in: ttl_left,
        })
    }

    /// What the server says of a named lease's remaining time (this
    /// client's own deadline for a lease it holds).
    pub(crate) async fn lease_remaining(&self, name: &str) -> Result<Option<Duration>> {
        let op = "lease remaining";
        let shared = self;
        let key = shared.etcd.keys.single(Kind::Lease, name);
        let Some(kv) = shared.etcd.get(op, key, None).await?.into_iter().next() else {
            return Ok(None);
        };
        // Held by this client: its own deadline is exact.
        if let Some(owner) = std::str::from_utf8(split_lease_value(kv.value()).0)
            .ok()
            .and_then(OwnerToken::from_hex)
        {
            let ek = entry_key(Kind::Lease, name, &owner);
            if let Some(e) = lock(&shared.entries).get(&ek) {
                // The key on this entry's lease: a grant of the owner
                // through another client moves it onto that client's lease
                // (maybe of a shorter TTL), and then only the server knows.
                if e.rev == kv.create_revision() && e.lease == kv.lease() {
                    if let EntryState::Held { deadline } = e.state {
                        let left = deadline.saturating_duration_since(Instant::now());
                        return Ok((!left.is_zero()).then_some(left));
                    }
                }
            }
        }
        // etcd answers in whole seconds: the lease "will expire in under
        // TTL+1 seconds". Report that bound (never above the granted TTL),
        // so no holder's local validity exceeds what the store says.
        let resp = shared
            .etcd
            .call(op, |mut c| {
                let id = kv.lease();
                async move { c.lease_time_to_live(id, None).await }
            })
            .await?;
        if resp.ttl() < 0 {
            return Ok(None);
        }
        let bound = (resp.ttl() + 1).min(resp.granted_ttl().max(1));
        Ok(Some(Duration::from_secs(bound as u64)))
    }
}
