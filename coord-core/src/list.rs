//! What a store holds, by name, as an operator asks for it (`coord ls`):
//! [`Coord::list`] over the store-specific [`Lister`].

use std::sync::Arc;

use tracing::Instrument;

use crate::backend::{Listed, Lister};
use crate::coord::Coord;
use crate::error::{Error, Result};
use crate::rwlock::RW_MARK;
use crate::validate;

/// The most names one [`Coord::list`] call returns.
pub const MAX_LIST: usize = 10_000;

/// The most names [`Coord::list`] asks a store for at once: semaphores
/// are asked for more than the limit when coord's own (read-write locks,
/// fair lock tickets) take places.
const MAX_ASK: usize = 4 * MAX_LIST;

impl Coord {
    /// The same handle with `lister` behind [`Coord::list`].
    ///
    /// ```
    /// # fn demo(coord: coord_core::Coord, lister: std::sync::Arc<dyn coord_core::Lister>) {
    /// let coord = coord.with_lister(lister);
    /// # }
    /// ```
    pub fn with_lister(mut self, lister: Arc<dyn Lister>) -> Coord {
        self.lister = Some(lister);
        self
    }

    /// Up to `limit` names of `kind` starting with `prefix` (all names
    /// when empty) that have state in the store now, sorted. A name whose
    /// claim has just ended may still be listed: inspect it
    /// ([`Locks::inspect`](crate::Locks::inspect) and the others) for what
    /// it holds. Read in bounded steps, never by a command that blocks the
    /// store (Redis: `SCAN`, on every master of a Cluster).
    ///
    /// Errors: [`Error::InvalidArgument`] for a `limit` of 0 or above
    /// [`MAX_LIST`], or a prefix with a control character or longer than a
    /// name; [`Error::Unsupported`] when this handle does not offer `kind`,
    /// or its store cannot list it (a Redis lock in the PHP layout, whose
    /// keys are bare names).
    ///
    /// ```
    /// # async fn demo(coord: coord_core::Coord) -> coord_core::Result<()> {
    /// use coord_core::Listed;
    /// for name in coord.list(Listed::Lock, "billing/", 100).await? {
    ///     let info = coord.locks()?.inspect(&name).await?;
    ///     if let Some(h) = info.holders.first() {
    ///         println!("{name}: held by {} for {:?}", h.owner_id, h.remaining);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        if limit == 0 || limit > MAX_LIST {
            return Err(Error::invalid(
                "limit",
                format!("is {limit}; must be from 1 to {MAX_LIST}"),
            ));
        }
        if !prefix.is_empty() {
            validate::name("prefix", prefix)?;
        }
        let offered = match kind {
            Listed::Lock => self.lock.is_some(),
            Listed::Lease => self.lease.is_some(),
            Listed::Election => self.election.is_some(),
            Listed::Semaphore => self.semaphore.is_some(),
            Listed::RwLock => self.rw_locks().is_ok(),
            Listed::Queue => self.queue.is_some(),
        };
        if !offered {
            return Err(self.unsupported(primitive(kind)));
        }
        let lister = self
            .lister
            .as_ref()
            .ok_or_else(|| self.unsupported("listing"))?;
        let store = self.caps.backend;
        let span = tracing::debug_span!("coord.list", store, kind = kind.as_str());
        let found = async {
            Ok::<_, Error>(match kind {
                Listed::RwLock => {
                    let under = format!("{RW_MARK}{prefix}");
                    let found = lister.names(Listed::Semaphore, &under, limit).await?;
                    found
                        .into_iter()
                        .filter_map(|n| n.strip_prefix(RW_MARK).map(str::to_string))
                        .collect()
                }
                Listed::Semaphore if prefix.is_empty() => {
                    // Read-write locks and the tickets of fair locks are
                    // semaphores underneath, named after a control
                    // character (no prefix a user gives matches them): ask
                    // for more until they no longer crowd the user's out.
                    let mut ask = limit;
                    loop {
                        let found = lister.names(Listed::Semaphore, prefix, ask).await?;
                        let exhausted = found.len() < ask;
                        let mine: Vec<String> = found
                            .into_iter()
                            .filter(|n| !n.starts_with('\u{1}'))
                            .collect();
                        if mine.len() >= limit || exhausted || ask >= MAX_ASK {
                            break mine;
                        }
                        ask = (ask * 4).min(MAX_ASK);
                    }
                }
                k => lister.names(k, prefix, limit).await?,
            })
        };
        let mut names: Vec<String> = found.instrument(span).await?;
        names.retain(|n| n.starts_with(prefix));
        names.sort();
        names.dedup();
        names.truncate(limit);
        Ok(names)
    }
}

/// The primitive's name in an [`Error::Unsupported`].
fn primitive(kind: Listed) -> &'static str {
    match kind {
        Listed::Lock => "locks",
        Listed::Lease => "leases",
        Listed::Election => "elections",
        Listed::Semaphore => "semaphores",
        Listed::RwLock => "read-write locks",
        Listed::Queue => "queues",
    }
}
