//! Late copies of timed-out claim attempts (`coord_core::late`) on locks,
//! leases and elections: an attempt delayed in the network past the call
//! timeout, landing after its owner gave up and released, takes nothing;
//! the race of such a copy with the release that marks its owner is
//! decided by the row lock, whichever comes first; the owner's own later
//! attempts and other owners are not refused; answered attempts leave no
//! mark; a mark keeps its row from the sweep while it holds.
//!
//! The slow client goes through a `FaultProxy` (see `support`). The
//! cases run one after the other.
//!
//! This file holds the helpers the files below share: taking a claim,
//! reading its row, and running the claim functions by hand.

use crate::support;

use conformance::facade_claim::FacadeClaim;
use coord_core::{Attempt, Lock, OwnerToken};
use coord_postgres::PostgresBackend;
use coord_postgres::tokio_postgres::Client;
use support::LONG;

mod late_copies;
mod marking_release_races;
mod marks;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The claim kinds the cases run on.
type Case = FacadeClaim;

fn kind(case: Case) -> &'static str {
    case.kind()
}

/// (owner set, marks) of the claim row of `kind`/`name`; None: no row.
async fn row(b: &PostgresBackend, kind: &str, name: &str) -> Option<(bool, i32)> {
    let c = b.pool().get().await.unwrap();
    let s = b.schema();
    c.query_opt(
        &format!(
            "SELECT owner IS NOT NULL, coalesce(cardinality(left_owners), 0) \
               FROM \"{s}\".claims WHERE kind = $1 AND name = $2"
        ),
        &[&kind, &name],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1)))
}

/// `claim_leave` run by hand on `c`: the release of `owner` on lock
/// `name`, marking it as left at `stamp` for 30 s. (held, woke).
async fn leave(
    c: &Client,
    schema: &str,
    name: &str,
    owner: &OwnerToken,
    stamp: i64,
) -> (bool, bool) {
    let owner: &[u8] = owner.as_bytes();
    let r = c
        .query_one(
            &format!(
                "SELECT held, woke FROM \"{schema}\".claim_leave('lock', $1::text, $2::bytea, \
                 'coord', false, $3::int8, 30000000::int8)"
            ),
            &[&name, &owner, &stamp],
        )
        .await
        .expect("claim_leave");
    (r.get(0), r.get(1))
}

/// `claim_acquire` run by hand: an attempt of `owner` on lock `name`
/// stamped `stamp` (None: a client of layout 11 or before). The token, if
/// granted.
async fn attempt(
    c: &Client,
    schema: &str,
    name: &str,
    owner: &OwnerToken,
    stamp: Option<i64>,
) -> Option<i64> {
    let owner: &[u8] = owner.as_bytes();
    let s = format!("\"{schema}\"");
    let r = match stamp {
        Some(at) => c
            .query_one(
                &format!(
                    "SELECT granted FROM {s}.claim_acquire('lock', $1::text, $2::bytea, NULL, \
                     30000000::int8, 'coord', false, false, NULL::bytea, $3::int8)"
                ),
                &[&name, &owner, &at],
            )
            .await
            .expect("claim_acquire"),
        None => c
            .query_one(
                &format!(
                    "SELECT granted FROM {s}.claim_acquire('lock', $1::text, $2::bytea, NULL, \
                     30000000::int8, 'coord', false, false, NULL::bytea, NULL::int8)"
                ),
                &[&name, &owner],
            )
            .await
            .expect("claim_acquire, layout-11 signature"),
    };
    r.get(0)
}

/// One answered grant and release of `name` by a new owner; panics if
/// the grant is refused.
async fn cycle(b: &PostgresBackend, name: &str) {
    let o = OwnerToken::random();
    assert!(matches!(
        Lock::try_acquire(b, name, o.step(), LONG).await.unwrap(),
        Attempt::Granted(_)
    ));
    assert!(Lock::release(b, name, o.step()).await.unwrap());
}
