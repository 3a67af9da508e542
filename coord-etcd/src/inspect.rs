//! Inspection: the live holders of a lock, named lease or semaphore as
//! the store records them, from one range read (for a semaphore, one
//! transaction and the next pages of its grants at its revision), plus a `LeaseTimeToLive` per holder for its remaining time.
//!
//! Metadata lives in the grant's own key (a lock key's or a named lease's
//! value after the owner's hex; a semaphore grant's value after its
//! slots), so it ends exactly with the grant and no key is written for
//! it.

use std::time::Duration;

use coord_core::inspect::{ClaimRecord, HolderRecord, LeaderRecord};
use coord_core::util::Kind;
use coord_core::{FencingToken, OwnerToken, Result};
use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse};

use crate::client::keys::{prefix_end, split_lease_value};
use crate::client::{Etcd, corrupt, first_page, header_rev, is_compacted};
use crate::semaphore::{owner_in, parse, split_value};

/// A semaphore's holders whose remaining time is asked for at most (one
/// call each, concurrently); beyond, it is not shown.
const MAX_TTL_CALLS: usize = 32;

/// The owner whose hex is `hex`, or the store's data is not coord's.
fn owner_of(hex: &[u8], op: &'static str, what: &str) -> Result<OwnerToken> {
    std::str::from_utf8(hex)
        .ok()
        .and_then(OwnerToken::from_hex)
        .ok_or_else(|| corrupt(op, what))
}

/// The remaining time of lease `id` as etcd reports it (whole
/// seconds): `Ok(None)` if the server no longer has it (its keys are
/// gone), `Ok(Some(None))` if it cannot tell (no lease, or the call
/// failed: the holder is shown without its remaining time).
async fn lease_left(etcd: &Etcd, id: i64, op: &'static str) -> Option<Option<Duration>> {
    if id == 0 {
        return Some(None);
    }
    match etcd
        .call(
            op,
            |mut c| async move { c.lease_time_to_live(id, None).await },
        )
        .await
    {
        Ok(r) if r.ttl() < 0 => None,
        Ok(r) => Some(Some(Duration::from_secs(r.ttl() as u64))),
        Err(_) => Some(None),
    }
}

/// A lock's holder (the first key of its queue) and how many keys wait
/// behind it: one range read with a limit of one (its count is the
/// whole queue's).
pub(crate) async fn lock(etcd: &Etcd, name: &str) -> Result<ClaimRecord> {
    let op = "lock inspect";
    let queue = etcd.keys.queue(Kind::Lock, name);
    let end = prefix_end(&queue);
    let opts = GetOptions::new()
        .with_range(end)
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let resp = etcd
        .call_kv(op, |mut c| {
            let (k, o) = (queue.clone(), opts.clone());
            async move { c.get(k, Some(o)).await }
        })
        .await?;
    let count = u64::try_from(resp.count()).unwrap_or(0);
    let Some(head) = resp.kvs().first().cloned() else {
        return Ok(ClaimRecord {
            holders: Vec::new(),
            waiters: Some(0),
        });
    };
    let (hex, metadata) = split_lease_value(head.value());
    let owner = owner_of(hex, op, "lock key")?;
    let metadata = metadata.map(<[u8]>::to_vec);
    let holders = holder(etcd, &head, owner, metadata, 1, op)
        .await
        .into_iter()
        .collect();
    Ok(ClaimRecord {
        holders,
        waiters: Some(count.saturating_sub(1)),
    })
}

/// An election's leader: the first key of its queue (candidates do
/// not queue keys while they wait, so no waiters are counted), its
/// owner and candidate from the value, its remaining time from its
/// lease.
pub(crate) async fn election(etcd: &Etcd, name: &str) -> Result<Option<LeaderRecord>> {
    let op = "election inspect";
    let Some(head) = etcd.head(Kind::Election, name, op).await? else {
        return Ok(None);
    };
    let (hex, candidate) = split_lease_value(head.value());
    let owner = owner_of(hex, op, "election key")?;
    let candidate = String::from_utf8_lossy(candidate.unwrap_or_default()).into_owned();
    Ok(holder(etcd, &head, owner, None, 1, op)
        .await
        .map(|holder| LeaderRecord { candidate, holder }))
}

/// A named lease's holder: one read of its key.
pub(crate) async fn lease(etcd: &Etcd, name: &str) -> Result<ClaimRecord> {
    let op = "lease inspect";
    let key = etcd.keys.single(Kind::Lease, name);
    let Some(kv) = etcd.get(op, key, None).await?.into_iter().next() else {
        return Ok(ClaimRecord::default());
    };
    let (hex, metadata) = split_lease_value(kv.value());
    let owner = owner_of(hex, op, "lease")?;
    let metadata = metadata.map(<[u8]>::to_vec);
    Ok(ClaimRecord {
        holders: holder(etcd, &kv, owner, metadata, 1, op)
            .await
            .into_iter()
            .collect(),
        waiters: None,
    })
}

/// A semaphore's grants (with their values, in pages) and the number of
/// queued waiters, in one snapshot; the grants' remaining times are asked
/// for concurrently (up to [`MAX_TTL_CALLS`] of them).
pub(crate) async fn semaphore(etcd: &Etcd, name: &str) -> Result<ClaimRecord> {
    let op = "semaphore inspect";
    let base = etcd.keys.sem(name);
    let range = |p: &[u8]| {
        let k = [&base[..], p].concat();
        let e = prefix_end(&k);
        (k, e)
    };
    let ((h, he), (w, we)) = (range(b"h/"), range(b"w/"));
    let mut tries = 0;
    let (holds, waiters) = loop {
        let txn = Txn::new().and_then([
            first_page(h.clone(), &he, false),
            TxnOp::get(
                w.clone(),
                Some(GetOptions::new().with_range(we.clone()).with_count_only()),
            ),
        ]);
        let resp = etcd.txn(op, txn).await?;
        let rev = header_rev(&resp);
        let mut rs = resp.op_responses().into_iter();
        let (Some(TxnOpResponse::Get(hg)), Some(TxnOpResponse::Get(wg))) = (rs.next(), rs.next())
        else {
            return Err(corrupt(op, "a semaphore read's answer"));
        };
        let waiters = u64::try_from(wg.count()).unwrap_or(0);
        // The grants' next pages, at the same revision.
        match etcd.rest_of(op, hg, &he, rev, false).await {
            Ok(holds) => break (holds, waiters),
            Err(e) if is_compacted(&e) && tries < 3 => tries += 1,
            Err(e) => return Err(e),
        }
    };
    let mut grants = Vec::new();
    for kv in holds {
        let hex = owner_in(kv.value()).unwrap_or_default();
        let owner = owner_of(hex, op, "semaphore grant")?;
        let (permits, _) =
            parse(kv.value()).ok_or_else(|| corrupt(op, "a semaphore key's value"))?;
        let metadata = split_value(kv.value()).1.map(<[u8]>::to_vec);
        grants.push((kv, owner, metadata, permits));
    }
    let ask = grants.len() <= MAX_TTL_CALLS;
    let holders = futures::future::join_all(grants.into_iter().map(
        |(kv, owner, metadata, permits)| async move {
            if ask {
                holder(etcd, &kv, owner, metadata, permits, op).await
            } else {
                Some(record(&kv, owner, metadata, permits, None))
            }
        },
    ))
    .await;
    Ok(ClaimRecord {
        holders: holders.into_iter().flatten().collect(),
        waiters: Some(waiters),
    })
}

/// The holder of `kv` with its lease's remaining time, or `None` if
/// the server says its lease is gone (and the key with it).
async fn holder(
    etcd: &Etcd,
    kv: &KeyValue,
    owner: OwnerToken,
    metadata: Option<Vec<u8>>,
    permits: u32,
    op: &'static str,
) -> Option<HolderRecord> {
    let remaining = lease_left(etcd, kv.lease(), op).await?;
    Some(record(kv, owner, metadata, permits, remaining))
}

fn record(
    kv: &KeyValue,
    owner: OwnerToken,
    metadata: Option<Vec<u8>>,
    permits: u32,
    remaining: Option<Duration>,
) -> HolderRecord {
    HolderRecord {
        owner,
        token: FencingToken(kv.create_revision().max(0) as u64),
        remaining,
        metadata,
        permits,
    }
}
