//! Listing names on a Redlock deployment: every master's, in parallel,
//! once a quorum of masters answered; a name is listed when a quorum of
//! them hold it, as a lock is held when a quorum holds it. A name on fewer
//! masters is being released (a release returns once a quorum released,
//! the others' releases still on their way) or was refused. So a name held
//! by exactly a quorum, one of whose masters did not answer, is left out;
//! and each master lists at most `limit` names, so a master holding more
//! than `limit` names under the prefix may leave out one held elsewhere.

use std::collections::BTreeMap;

use coord_core::{Listed, Lister, Result, async_trait};
use futures::FutureExt;

use super::RedlockBackend;

#[async_trait]
impl Lister for RedlockBackend {
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        const OP: &str = "list";
        let prefix = prefix.to_string();
        let answers = self
            .fan(
                OP,
                None,
                false,
                move |_, b| {
                    let prefix = prefix.clone();
                    async move { b.names(kind, &prefix, limit).await }.boxed()
                },
                |a| a.iter().all(Option::is_some),
            )
            .await;
        let lists: Vec<&Vec<String>> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(names)) => Some(names),
                _ => None,
            })
            .collect();
        if lists.len() < self.quorum {
            return Err(self.no_quorum(OP, &answers));
        }
        // Held is held by a quorum: a name on fewer masters is a claim
        // being released (its release returned once a quorum released) or
        // an attempt that was refused.
        let mut seen: BTreeMap<&String, usize> = BTreeMap::new();
        for name in lists.into_iter().flatten() {
            *seen.entry(name).or_default() += 1;
        }
        Ok(seen
            .into_iter()
            .filter(|(_, n)| *n >= self.quorum)
            .map(|(name, _)| name.clone())
            .take(limit)
            .collect())
    }
}
