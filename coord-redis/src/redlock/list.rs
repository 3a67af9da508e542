//! Listing names on a Redlock deployment: every master's, in parallel;
//! a name held on any master that answered is listed (inspect it for
//! whether a quorum holds it), once a quorum of masters answered.

use std::collections::BTreeSet;

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
        let names: BTreeSet<&String> = lists.into_iter().flatten().collect();
        Ok(names.into_iter().take(limit).cloned().collect())
    }
}
