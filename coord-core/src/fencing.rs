//! Fencing tokens on their own, and the resource side that honours them.

use std::sync::{Arc, Mutex};

use crate::backend::FencingSource;
use crate::coord::Coord;
use crate::error::Result;
use crate::types::FencingToken;
use crate::validate;

/// Fencing tokens per resource, independent of any lock (the PHP original's
/// `INCR fencing_token_<resource>`).
///
/// ```
/// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
/// let fencing = coord.fencing()?;
/// let a = fencing.next("invoice-store").await?;
/// let b = fencing.next("invoice-store").await?;
/// assert!(b > a);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Fencing {
    backend: Arc<dyn FencingSource>,
}

impl std::fmt::Debug for Fencing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fencing")
            .field("backend", &self.backend.capabilities().backend)
            .finish()
    }
}

impl Coord {
    /// The fencing sources of this store. Errors: [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn fencing(&self) -> Result<Fencing> {
        Ok(Fencing {
            backend: self
                .fencing
                .clone()
                .ok_or_else(|| self.unsupported("fencing tokens"))?,
        })
    }
}

impl Fencing {
    /// The next token for `resource`: strictly greater than every token
    /// handed out for it before, across all clients (and across restarts as
    /// far as [`Capabilities::fencing`](crate::Capabilities::fencing) says).
    /// Cost: one round trip.
    pub async fn next(&self, resource: &str) -> Result<FencingToken> {
        validate::name("resource", resource)?;
        let store = self.backend.capabilities().backend;
        op!(
            "coord.fencing.next",
            store,
            resource,
            self.backend.next(resource)
        )
    }
}

/// A resource that honours fencing tokens, in process: it accepts a write
/// iff its token is at least the highest it has seen, check and update
/// atomic. The shape every fenced resource needs (the PHP original's
/// `WHERE fencing_token < ?`, with `<=` so the same holder may write twice).
///
/// ```
/// use coord_core::{FencedRegister, FencingToken};
/// let reg = FencedRegister::new(0u32);
/// assert!(reg.write(FencingToken(5), 1));
/// assert!(!reg.write(FencingToken(4), 2)); // a stale holder is rejected
/// assert_eq!(reg.read(), (1, Some(FencingToken(5))));
/// ```
#[derive(Debug, Default)]
pub struct FencedRegister<T> {
    state: Mutex<(T, Option<FencingToken>)>,
}

impl<T: Clone> FencedRegister<T> {
    /// A register holding `value`, having seen no token.
    pub fn new(value: T) -> Self {
        FencedRegister {
            state: Mutex::new((value, None)),
        }
    }

    /// Write `value` iff `token` >= the highest token seen; returns whether
    /// it was accepted.
    pub fn write(&self, token: FencingToken, value: T) -> bool {
        self.update(token, |v| *v = value)
    }

    /// Apply `f` iff `token` >= the highest token seen; returns whether it
    /// was applied.
    pub fn update(&self, token: FencingToken, f: impl FnOnce(&mut T)) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.1.is_some_and(|seen| token < seen) {
            return false;
        }
        s.1 = Some(token);
        f(&mut s.0);
        true
    }

    /// The value and the highest token seen.
    pub fn read(&self) -> (T, Option<FencingToken>) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (s.0.clone(), s.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_register_takes_equal_and_higher_tokens_and_refuses_lower() {
        let r = FencedRegister::new(0);
        assert!(r.write(FencingToken(5), 1));
        // The same holder writes again under its token.
        assert!(r.write(FencingToken(5), 2));
        assert!(r.update(FencingToken(7), |v| *v += 1));
        assert!(!r.write(FencingToken(6), 9), "a lower token was accepted");
        assert_eq!(r.read(), (3, Some(FencingToken(7))));
    }
}
