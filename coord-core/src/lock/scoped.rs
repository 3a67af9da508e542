//! The scoped form: run work under a lock, stop it if the lock is lost,
//! and end the claim afterwards.

use std::future::Future;

use super::{LockOptions, Locks};
use crate::claim::{Guard, Ownership};
use crate::error::Error;

impl Locks {
    /// Run `work` while holding `name`, with the watchdog on, and release
    /// afterwards. If ownership is lost while `work` runs, `work` is stopped
    /// (its future dropped) and [`WithLockError::Lock`] carries
    /// [`Error::Lost`].
    ///
    /// `work` receives an [`Ownership`] with the fencing token to pass to
    /// the resources it writes.
    ///
    /// **The work's result is never thrown away.** Once `work` has
    /// finished, a failed release (the store briefly unavailable, or the
    /// lock found expired) is [`WithLockError::Release`], which carries the
    /// output next to the error: the work ran to completion and must not be
    /// redone. The lock then ends at its TTL at the latest. `?` converts
    /// either variant into [`Error`] (dropping the output knowingly); match
    /// on it where the output matters.
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use std::time::Duration;
    /// use coord_core::{LockOptions, WithLockError};
    /// let locks = coord.locks()?;
    /// let opts = LockOptions::new(Duration::from_secs(10)).wait(Duration::from_secs(5));
    /// let total = match locks.with_lock("report", opts, |held| async move {
    ///     // ... write with held.fencing_token() ...
    ///     held.fencing_token().get()
    /// }).await {
    ///     Ok(total) => total,
    ///     // Done, but the release failed: keep the result, do not redo it.
    ///     Err(WithLockError::Release { output, .. }) => output,
    ///     Err(WithLockError::Lock(e)) => return Err(e),
    /// };
    /// # let _ = total; Ok(()) }
    /// ```
    pub async fn with_lock<F, Fut, T>(
        &self,
        name: &str,
        opts: LockOptions,
        work: F,
    ) -> std::result::Result<T, WithLockError<T>>
    where
        F: FnOnce(Ownership) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self
            .acquire_with(name, opts.watchdog(true))
            .await
            .map_err(WithLockError::Lock)?;
        hold_while(guard, work).await
    }
}

/// Run `work` under `guard` (its watchdog on), stop it (drop its future)
/// if ownership is lost meanwhile, and end the claim afterwards: the
/// scoped forms [`Locks::with_lock`] and
/// [`Elections::with_leadership`](crate::Elections::with_leadership).
pub(crate) async fn hold_while<F, Fut, T>(
    guard: Guard,
    work: F,
) -> std::result::Result<T, WithLockError<T>>
where
    F: FnOnce(Ownership) -> Fut,
    Fut: Future<Output = T>,
{
    let name = guard.name().to_string();
    let lost = guard.lost();
    let fut = work(guard.ownership());
    tokio::select! {
        biased;
        _ = lost => {
            let _ = guard.release().await;
            Err(WithLockError::Lock(Error::Lost { name }))
        }
        output = fut => {
            match guard.release().await {
                Ok(()) => Ok(output),
                Err(Error::NotHeld { .. }) => Err(WithLockError::Release {
                    output,
                    error: Error::Lost { name },
                }),
                Err(error) => Err(WithLockError::Release { output, error }),
            }
        }
    }
}

/// Why [`Locks::with_lock`] (or
/// [`Elections::with_leadership`](crate::Elections::with_leadership)) did
/// not simply return the work's output. For a leadership, "lock" reads
/// "leadership" and "release" reads "resign".
#[derive(Debug)]
pub enum WithLockError<T> {
    /// The lock was not acquired, or it was lost while the work ran (the
    /// work was stopped before it finished: [`Error::Lost`]). There is no
    /// output.
    Lock(Error),
    /// The work finished, then releasing the lock failed: `error` says why
    /// ([`Error::Lost`] if the store no longer held it for us, so part of
    /// the work may have run unprotected). The lock ends at its TTL at the
    /// latest. `output` is the work's result: do not redo the work.
    Release {
        /// What the work returned.
        output: T,
        /// Why the release failed.
        error: Error,
    },
}

impl<T> WithLockError<T> {
    /// The error, dropping any output.
    pub fn error(&self) -> &Error {
        match self {
            WithLockError::Lock(e) | WithLockError::Release { error: e, .. } => e,
        }
    }

    /// The work's output, if it finished.
    pub fn into_output(self) -> Option<T> {
        match self {
            WithLockError::Lock(_) => None,
            WithLockError::Release { output, .. } => Some(output),
        }
    }
}

impl<T> std::fmt::Display for WithLockError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WithLockError::Lock(e) => e.fmt(f),
            WithLockError::Release { error, .. } => write!(
                f,
                "the work under the lock finished, but releasing the lock failed \
                 (it ends at its TTL; do not redo the work): {error}"
            ),
        }
    }
}

impl<T: std::fmt::Debug> std::error::Error for WithLockError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.error())
    }
}

impl<T> From<WithLockError<T>> for Error {
    /// The error; a finished work's output is dropped.
    fn from(e: WithLockError<T>) -> Error {
        match e {
            WithLockError::Lock(e) | WithLockError::Release { error: e, .. } => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_error_keeps_the_output_and_its_source() {
        let e: WithLockError<u32> = WithLockError::Release {
            output: 7,
            error: Error::Lost { name: "a".into() },
        };
        let source = std::error::Error::source(&e).expect("the release error is the source");
        assert_eq!(
            source.to_string(),
            Error::Lost { name: "a".into() }.to_string()
        );
        assert!(e.to_string().contains("do not redo the work"), "{e}");
        assert!(e.error().is_ownership_lost());
        assert_eq!(e.into_output(), Some(7));
        let e: WithLockError<u32> = WithLockError::Lock(Error::NotHeld { name: "a".into() });
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(e.into_output(), None);
    }
}
