//! Ending a claim whoever holds it, the same on every store: read the
//! holder's owner token as the store records it (`inspect`), end the claim
//! as that owner (owner-checked, so a claim that changed hands meanwhile
//! is never ended by mistake), and read again if it did. For the
//! operator's force release of leases and leaderships, which the backends
//! need no step of their own for.

use std::future::Future;

use crate::error::{Error, Result};
use crate::types::OwnerToken;

/// How many holders in a row one force release tries before it reports
/// that the name keeps changing hands.
const TRIES: usize = 5;

/// End the claim on `name` whoever holds it: `holder` reads its owner
/// (`None`: nobody holds it), `end` ends it as that owner (`Ok(false)`:
/// that owner no longer held it). Returns whether a live claim was ended.
pub(crate) async fn end_whoever_holds<H, HF, E, EF>(
    store: &'static str,
    operation: &'static str,
    name: &str,
    mut holder: H,
    mut end: E,
) -> Result<bool>
where
    H: FnMut() -> HF,
    HF: Future<Output = Result<Option<OwnerToken>>>,
    E: FnMut(OwnerToken) -> EF,
    EF: Future<Output = Result<bool>>,
{
    for _ in 0..TRIES {
        let Some(owner) = holder().await? else {
            return Ok(false);
        };
        if end(owner).await? {
            return Ok(true);
        }
    }
    Err(Error::Unavailable {
        backend: store,
        operation,
        message: format!(
            "`{name}` changed hands {TRIES} times while it was being ended; try again"
        ),
        source: None,
    })
}
