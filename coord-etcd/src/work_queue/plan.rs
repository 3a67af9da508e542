//! One step of a work queue operation.
//!
//! A step reads what it needs (one read-only transaction, or two when a
//! read depends on another), then sends ONE transaction: its compares hold
//! every read it relied on still true (each key seen has the same mod
//! revision, nothing was written into a range it read since its revision,
//! a key it found missing is still missing; or, where a step relies on
//! less of what it read, exactly that: a push behind older ready messages
//! of its group compares the group record's create revision, not its mod
//! revision, see `group.rs`), its writes are coalesced (a
//! key is written at most once). A transaction whose compares fail changed
//! nothing: the step is tried again on fresh reads ([`Retry`]).

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_core::{Error, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::time::{Instant, sleep};

use crate::client::keys::BACKEND;
use crate::client::{Etcd, header_rev};
use crate::work_queue::keys::after;

/// The answers of one transaction's reads, in order, and its revision.
pub(crate) struct Snap {
    pub(crate) rev: i64,
    lists: Vec<Vec<KeyValue>>,
}

impl Snap {
    /// The answers of `resp`'s operations (those that were not reads
    /// answer nothing).
    pub(crate) fn of(resp: &TxnResponse) -> Snap {
        Self::at(resp, header_rev(resp))
    }

    /// The answers of `resp` (a nested transaction's, which carries no
    /// revision of its own) read at revision `rev`.
    pub(crate) fn at(resp: &TxnResponse, rev: i64) -> Snap {
        let lists = resp
            .op_responses()
            .into_iter()
            .map(|r| match r {
                etcd_client::TxnOpResponse::Get(mut g) => g.take_kvs(),
                _ => Vec::new(),
            })
            .collect();
        Snap { rev, lists }
    }

    /// The keys read by operation `i`.
    pub(crate) fn list(&self, i: usize) -> &[KeyValue] {
        self.lists.get(i).map_or(&[], |l| l.as_slice())
    }

    /// The first key read by operation `i`.
    pub(crate) fn one(&self, i: usize) -> Option<&KeyValue> {
        self.list(i).first()
    }
}

/// Read `ops` in one snapshot.
pub(crate) async fn read(sh: &Etcd, op: &'static str, ops: Vec<TxnOp>) -> Result<Snap> {
    Ok(Snap::of(&sh.txn(op, Txn::new().and_then(ops)).await?))
}

/// Read one key.
pub(crate) fn get(key: Vec<u8>) -> TxnOp {
    TxnOp::get(key, None)
}

/// Read up to `limit` keys of `[start, end)` with their values.
pub(crate) fn range(start: Vec<u8>, end: Vec<u8>, limit: i64) -> TxnOp {
    TxnOp::get(
        start,
        Some(GetOptions::new().with_range(end).with_limit(limit)),
    )
}

/// Milliseconds since the Unix epoch on this client's clock, rounded down.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64)
}

/// This client's clock `d` from now, in Unix ms, rounded up (a deadline is
/// never earlier than the caller's own reckoning of it).
pub(crate) fn deadline_ms(d: Duration) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let ceil = |x: Duration| x.as_nanos().div_ceil(1_000_000).min(u128::from(u64::MAX)) as u64;
    ceil(now).saturating_add(ceil(d))
}

/// The time from now until Unix ms `at` (zero if it passed).
pub(crate) fn until_ms(at: u64) -> Duration {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Duration::from_millis(at).saturating_sub(now)
}

/// The compares and coalesced writes of one transaction.
#[derive(Default, Clone)]
pub(crate) struct Plan {
    cmp: Vec<Compare>,
    /// Key -> (value, lease) to put, or `None` to delete.
    writes: BTreeMap<Vec<u8>, Option<(Vec<u8>, i64)>>,
}

impl Plan {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn put(&mut self, key: Vec<u8>, value: impl Into<Vec<u8>>) {
        self.writes.insert(key, Some((value.into(), 0)));
    }

    pub(crate) fn put_leased(&mut self, key: Vec<u8>, value: impl Into<Vec<u8>>, lease: i64) {
        self.writes.insert(key, Some((value.into(), lease)));
    }

    pub(crate) fn del(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
    }

    /// `kv` is unchanged (and still there).
    pub(crate) fn same(&mut self, kv: &KeyValue) {
        self.cmp.push(Compare::mod_revision(
            kv.key(),
            CompareOp::Equal,
            kv.mod_revision(),
        ));
    }

    /// `key`'s mod revision is `rev` (it is still as written then).
    pub(crate) fn rev_is(&mut self, key: Vec<u8>, rev: i64) {
        self.cmp
            .push(Compare::mod_revision(key, CompareOp::Equal, rev));
    }

    /// `kv` is still there (whatever was written to it since).
    pub(crate) fn exists_as(&mut self, kv: &KeyValue) {
        self.cmp.push(Compare::create_revision(
            kv.key(),
            CompareOp::Equal,
            kv.create_revision(),
        ));
    }

    /// `key` exists.
    pub(crate) fn exists(&mut self, key: Vec<u8>) {
        self.cmp.push(Compare::version(key, CompareOp::Greater, 0));
    }

    /// `key` exists and its value compares to `value` as `op` says
    /// (bytewise: fixed-width decimals compare as their numbers).
    pub(crate) fn value_cmp(&mut self, key: Vec<u8>, op: CompareOp, value: Vec<u8>) {
        self.cmp.push(Compare::value(key, op, value));
    }

    /// `key` does not exist.
    pub(crate) fn absent(&mut self, key: Vec<u8>) {
        self.cmp.push(Compare::version(key, CompareOp::Equal, 0));
    }

    /// No key exists in `[start, end)`.
    pub(crate) fn none_in(&mut self, start: &[u8], end: &[u8]) {
        if start < end {
            self.cmp
                .push(Compare::create_revision(start, CompareOp::Less, 1).with_range(end));
        }
    }

    /// No key in `[start, end)` was written after revision `rev`.
    fn unchanged_since(&mut self, start: &[u8], end: &[u8], rev: i64) {
        if start < end {
            self.cmp.push(
                Compare::mod_revision(start, CompareOp::Less, rev.saturating_add(1))
                    .with_range(end),
            );
        }
    }

    /// A read of up to `limit` keys of `[start, end)` at `rev` that found
    /// `kvs` still finds them: each is unchanged and nothing was written
    /// into the part of the range it covered.
    pub(crate) fn still(
        &mut self,
        start: &[u8],
        end: &[u8],
        limit: usize,
        kvs: &[KeyValue],
        rev: i64,
    ) {
        for kv in kvs {
            self.same(kv);
        }
        let covered = match kvs.last() {
            Some(last) if kvs.len() >= limit => after(last.key()),
            _ => end.to_vec(),
        };
        self.unchanged_since(start, &covered, rev);
    }

    /// The transaction: if every compare holds, `first` and then the
    /// writes; else `failure`.
    pub(crate) fn into_txn(self, first: Vec<TxnOp>, failure: Vec<TxnOp>) -> Txn {
        let mut ops = first;
        for (k, w) in self.writes {
            ops.push(match w {
                Some((v, 0)) => TxnOp::put(k, v, None),
                Some((v, lease)) => TxnOp::put(k, v, Some(PutOptions::new().with_lease(lease))),
                None => TxnOp::delete(k, None),
            });
        }
        Txn::new().when(self.cmp).and_then(ops).or_else(failure)
    }
}

/// How many operations etcd takes in one transaction by default
/// (`--max-txn-ops`). A nested transaction counts against what is left of
/// it after the levels around it (each takes the most of its compares,
/// its success operations and its failure operations).
const TXN_OPS: usize = 128;

/// One transaction of alternative `levels`, each tried when the one
/// before it fails: the first whose compares hold runs `first` and its
/// writes; if none does, `failure`. Levels past what etcd takes in one
/// transaction are left out. `None` when there are no levels; else the
/// transaction and how many levels it holds.
pub(crate) fn nest(
    levels: Vec<Plan>,
    first: Vec<TxnOp>,
    failure: Vec<TxnOp>,
) -> Option<(Txn, usize)> {
    let mut left = TXN_OPS;
    let mut kept = 0;
    for level in &levels {
        let width = level
            .cmp
            .len()
            .max(first.len() + level.writes.len())
            .max(failure.len().max(1));
        if width > left {
            break;
        }
        left -= width;
        kept += 1;
    }
    let mut txn: Option<Txn> = None;
    for level in levels.into_iter().take(kept).rev() {
        let otherwise = match txn.take() {
            Some(t) => vec![TxnOp::txn(t)],
            None => failure.clone(),
        };
        txn = Some(level.into_txn(first.clone(), otherwise));
    }
    txn.map(|t| (t, kept))
}

/// Send `levels` as one transaction ([`nest`], nothing read, nothing on
/// failure): whether one of them was applied.
pub(crate) async fn apply_first(sh: &Etcd, op: &'static str, levels: Vec<Plan>) -> Result<bool> {
    let Some((txn, n)) = nest(levels, vec![], vec![]) else {
        return Ok(false);
    };
    Ok(landed(sh.txn(op, txn).await?, n).0.is_some())
}

/// Which level of a transaction of `levels` nested levels ([`nest`]) was
/// applied, and that level's response (or, when none was, the response of
/// the last one's `failure`).
pub(crate) fn landed(resp: TxnResponse, levels: usize) -> (Option<usize>, TxnResponse) {
    let mut cur = resp;
    let mut level = 0;
    loop {
        if cur.succeeded() {
            return (Some(level), cur);
        }
        match cur.op_responses().into_iter().next() {
            Some(TxnOpResponse::Txn(inner)) if level + 1 < levels => {
                cur = inner;
                level += 1;
            }
            _ => return (None, cur),
        }
    }
}

/// Bounded retries of a step whose transaction lost a race: a random
/// backoff growing to 40 ms, for at most the call timeout.
pub(crate) struct Retry {
    started: Instant,
    limit: Duration,
    round: u32,
    op: &'static str,
}

impl Retry {
    pub(crate) fn new(sh: &Etcd, op: &'static str) -> Self {
        Retry {
            started: Instant::now(),
            limit: sh.timeout,
            round: 0,
            op,
        }
    }

    /// `Error::Unavailable` once the time is up, for a step that made
    /// progress but has more to do (what it did stays done).
    pub(crate) fn within(&self, what: &str) -> Result<()> {
        if self.started.elapsed() < self.limit {
            return Ok(());
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            operation: self.op,
            message: format!(
                "still {what} after {:?}; the next call goes on from there",
                self.started.elapsed()
            ),
            source: None,
        })
    }

    /// Try again at once, on reads the lost transaction made itself (its
    /// failure branch): they are as fresh as reads get, and waiting first
    /// would only let the queue move on from them. `Error::Unavailable`
    /// once the time is up.
    pub(crate) fn at_once(&mut self) -> Result<()> {
        self.round += 1;
        match self.started.elapsed() >= self.limit {
            true => Err(self.gave_up()),
            false => Ok(()),
        }
    }

    /// What a step that kept losing races reports.
    fn gave_up(&self) -> Error {
        Error::Unavailable {
            backend: BACKEND,
            operation: self.op,
            message: format!(
                "gave up after {} attempts in {:?}, each losing a race with another \
                 client's change of the queue",
                self.round,
                self.started.elapsed()
            ),
            source: None,
        }
    }

    /// Wait before the next try; `Error::Unavailable` once the time is up.
    pub(crate) async fn again(&mut self) -> Result<()> {
        self.round += 1;
        if self.started.elapsed() >= self.limit {
            return Err(self.gave_up());
        }
        let cap = (1u64 << self.round.min(6)).min(40);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(self.round);
        sleep(Duration::from_micros(h.finish() % (cap * 1000 + 1))).await;
        Ok(())
    }
}
