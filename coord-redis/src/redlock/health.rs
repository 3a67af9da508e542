//! The health probe of a Redlock deployment: every master's, in
//! parallel; healthy when a quorum answers.

use coord_core::{Probe, Result, ServerInfo, async_trait};
use futures::FutureExt;

use super::RedlockBackend;

#[async_trait]
impl Probe for RedlockBackend {
    async fn probe(&self) -> Result<ServerInfo> {
        const OP: &str = "health probe";
        let answers = self
            .fan(
                OP,
                None,
                false,
                |_, b| async move { b.probe().await }.boxed(),
                |a| a.iter().all(Option::is_some),
            )
            .await;
        let versions: Vec<String> = answers
            .iter()
            .filter_map(|a| match a {
                Some(Ok(info)) => Some(info.version.clone()),
                _ => None,
            })
            .collect();
        if versions.len() < self.quorum {
            return Err(self.no_quorum(OP, &answers));
        }
        let mut distinct = versions.clone();
        distinct.sort();
        distinct.dedup();
        Ok(ServerInfo::new(format!(
            "{} ({} of {} masters answered)",
            distinct.join(", "),
            versions.len(),
            self.masters.len()
        )))
    }
}
