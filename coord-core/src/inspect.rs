//! Holder metadata and inspection: who holds a lock, lease or semaphore
//! permits, since when, with which fencing token and how much time left,
//! as the store records it.
//!
//! A grant may carry a small JSON value chosen by the caller (who, why:
//! `{"host": "web-3", "pid": 4242, "job": "nightly"}`), stored with the
//! grant on the store and shown by `inspect` to anybody. The holder's owner
//! token is never shown: only its [`owner_id`](crate::Guard::owner_id), a
//! fingerprint that cannot release or extend anything.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::types::{FencingToken, OwnerToken};

/// The largest holder metadata, as serialized JSON: 1 KiB.
pub const MAX_METADATA_BYTES: usize = 1024;

/// A holder as the store records it: what a backend's `inspect` returns.
/// The core turns it into a [`Holder`] (the owner token becomes a
/// fingerprint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderRecord {
    /// The grant's owner token.
    pub owner: OwnerToken,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// Its remaining time as the store sees it, where the store can tell.
    pub remaining: Option<Duration>,
    /// The metadata stored with the grant (serialized JSON), if any.
    pub metadata: Option<Vec<u8>>,
    /// How many permits it holds (1 for a lock or lease).
    pub permits: u32,
}

/// What a backend's `inspect` returns for a name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimRecord {
    /// The live holders (at most one for a lock or lease).
    pub holders: Vec<HolderRecord>,
    /// How many waiters are queued, where the store keeps a queue.
    pub waiters: Option<u64>,
}

/// A live holder of a claim, as [`Locks::inspect`](crate::Locks::inspect)
/// and friends show it.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    /// A fingerprint of the holder's owner token (16 hex digits): compare
    /// it with [`Guard::owner_id`](crate::Guard::owner_id). It cannot be
    /// used to release or extend the claim.
    pub owner_id: String,
    /// The grant's fencing token.
    pub fencing_token: FencingToken,
    /// Its remaining time as the store sees it, where the store can tell.
    pub remaining: Option<Duration>,
    /// The metadata stored with the grant, if any.
    pub metadata: Option<serde_json::Value>,
    /// How many permits it holds (1 for a lock or lease).
    pub permits: u32,
}

/// What the store says about a claim's name.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// let info = coord.locks()?.inspect("nightly-report").await?;
/// match info.holders.first() {
///     Some(h) => println!("held by {} (token {}, {:?} left, {:?})",
///         h.owner_id, h.fencing_token, h.remaining, h.metadata),
///     None => println!("free"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimInfo {
    /// The live holders (at most one for a lock or lease).
    pub holders: Vec<Holder>,
    /// How many waiters are queued, where the store keeps a queue.
    pub waiters: Option<u64>,
}

/// A live leader as the store records it: what a backend's election
/// `inspect` returns. The core turns it into a [`LeaderDetails`] (the
/// owner token becomes a fingerprint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderRecord {
    /// The candidate's identity, as it campaigned.
    pub candidate: String,
    /// The leadership's grant: its owner token, its fencing token (the
    /// term) and its remaining time where the store can tell. Elections
    /// store no holder metadata (`None`); `permits` is 1.
    pub holder: HolderRecord,
}

/// The live leader of an election as
/// [`Elections::inspect`](crate::Elections::inspect) shows it: who, which
/// term, the owner id of its grant and how much time it has left.
///
/// No store tells how many candidates wait: they campaign by polling and
/// wake-ups and leave nothing behind while they wait.
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// match coord.elections()?.inspect("scheduler").await? {
///     Some(l) => println!("{} leads (term {}, owner {}, {:?} left)",
///         l.candidate, l.term, l.owner_id, l.remaining),
///     None => println!("no leader"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderDetails {
    /// The candidate's identity, as it campaigned.
    pub candidate: String,
    /// The term: the leadership's fencing token.
    pub term: FencingToken,
    /// A fingerprint of the leadership's owner token (16 hex digits):
    /// compare it with [`Guard::owner_id`](crate::Guard::owner_id) of a
    /// [`Leadership`](crate::Leadership). It cannot renew or resign it.
    pub owner_id: String,
    /// Its remaining time as the store sees it, where the store can tell.
    pub remaining: Option<Duration>,
}

/// Turn a backend's leader record into what users see.
pub(crate) fn leader(record: LeaderRecord) -> LeaderDetails {
    LeaderDetails {
        candidate: record.candidate,
        term: record.holder.token,
        owner_id: owner_id(&record.holder.owner),
        remaining: record.holder.remaining,
    }
}

/// The fingerprint shown for an owner token: FNV-1a 64 over its bytes, as
/// 16 hex digits. It identifies a holder without revealing its token.
///
/// ```
/// let t = coord_core::OwnerToken::random();
/// assert_eq!(coord_core::inspect::owner_id(&t).len(), 16);
/// assert_eq!(coord_core::inspect::owner_id(&t), coord_core::inspect::owner_id(&t));
/// ```
pub fn owner_id(owner: &OwnerToken) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in owner.as_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Serialize and check holder metadata before any I/O: at most
/// [`MAX_METADATA_BYTES`] as JSON.
///
/// ```
/// let ok = coord_core::inspect::metadata_bytes(&serde_json::json!({"host": "web-3"}));
/// assert!(ok.is_ok());
/// let big = serde_json::json!({"blob": "x".repeat(2000)});
/// assert!(coord_core::inspect::metadata_bytes(&big).is_err());
/// ```
pub fn metadata_bytes(value: &serde_json::Value) -> Result<Vec<u8>> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| Error::invalid("metadata", format!("cannot be encoded as JSON: {e}")))?;
    if bytes.len() > MAX_METADATA_BYTES {
        return Err(Error::invalid(
            "metadata",
            format!(
                "is {} bytes as JSON; at most {MAX_METADATA_BYTES}: keep it to who and why, and point to the rest",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

/// [`metadata_bytes`] of an optional value, as the grant paths take it.
pub(crate) fn optional_metadata(
    value: Option<&serde_json::Value>,
) -> Result<Option<std::sync::Arc<[u8]>>> {
    value.map(|v| metadata_bytes(v).map(Into::into)).transpose()
}

/// Turn a backend's record into what users see.
pub(crate) fn info(record: ClaimRecord) -> ClaimInfo {
    ClaimInfo {
        holders: record
            .holders
            .into_iter()
            .map(|h| Holder {
                owner_id: owner_id(&h.owner),
                fencing_token: h.token,
                remaining: h.remaining,
                // Written by coord as JSON; anything else is shown as a string.
                metadata: h.metadata.map(|m| {
                    serde_json::from_slice(&m).unwrap_or_else(|_| {
                        serde_json::Value::String(String::from_utf8_lossy(&m).into_owned())
                    })
                }),
                permits: h.permits,
            })
            .collect(),
        waiters: record.waiters,
    }
}

/// The outcome of an attempt that says who is in the way: the grant, or,
/// when it was not taken within the wait, the name's holders.
///
/// Returned by [`Locks::acquire_or_holders`](crate::Locks::acquire_or_holders),
/// [`Leases::grant_or_holders`](crate::Leases::grant_or_holders) and
/// [`Semaphores::acquire_or_holders`](crate::Semaphores::acquire_or_holders).
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// use std::time::Duration;
/// use coord_core::{Acquired, LockOptions};
/// let me = serde_json::json!({"host": "web-3", "job": "nightly"});
/// let opts = LockOptions::new(Duration::from_secs(30));
/// match coord.locks()?.acquire_or_holders("nightly", opts, Some(&me)).await? {
///     Acquired::Granted(guard) => guard.release().await?,
///     Acquired::Held(Some(info)) => {
///         for h in &info.holders {
///             println!("busy: held by {} ({:?}), {:?} left", h.owner_id, h.metadata, h.remaining);
///         }
///     }
///     Acquired::Held(None) => println!("busy; this store cannot tell by whom"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub enum Acquired<G> {
    /// Taken.
    Granted(G),
    /// Not taken within the wait. The holders as the store records them,
    /// read by one more round trip right after the last refused attempt:
    /// by then the holder may have left (`holders` empty) or another may
    /// hold it. Its `waiters` may still count this attempt's own place in
    /// a queueing store's line, which is withdrawn in the background.
    /// `None` where the store keeps no holder record (a backend without
    /// `inspect`).
    Held(Option<ClaimInfo>),
}

impl<G> Acquired<G> {
    /// The grant, if it was taken.
    pub fn granted(self) -> Option<G> {
        match self {
            Acquired::Granted(g) => Some(g),
            Acquired::Held(_) => None,
        }
    }

    /// Whether it was taken.
    pub fn is_granted(&self) -> bool {
        matches!(self, Acquired::Granted(_))
    }
}

/// The holders to report for a refused attempt: `inspect`'s answer, or
/// `None` where the backend does not implement it. Any other error of the
/// read is returned: the attempt itself left nothing behind.
pub(crate) async fn after_refusal<G, F>(read: F) -> Result<Acquired<G>>
where
    F: std::future::Future<Output = Result<ClaimInfo>>,
{
    match read.await {
        Ok(info) => Ok(Acquired::Held(Some(info))),
        Err(Error::Unsupported { .. }) => Ok(Acquired::Held(None)),
        Err(e) => Err(e),
    }
}
