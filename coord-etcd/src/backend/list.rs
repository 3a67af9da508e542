//! Listing names (`coord ls`): range reads of one kind's keys under the
//! escaped prefix, keys only, a page at a time.

use std::collections::BTreeSet;

use coord_core::util::Kind;
use coord_core::{Error, Listed, Lister, Result, async_trait};

use crate::backend::EtcdBackend;
use crate::client::keys::{BACKEND, escape, prefix_end, unescape};
use crate::client::page_opts;

/// The key segment of `kind`.
fn segment(kind: Listed) -> Option<&'static str> {
    Some(match kind {
        Listed::Lock => Kind::Lock.as_str(),
        Listed::Lease => Kind::Lease.as_str(),
        Listed::Election => Kind::Election.as_str(),
        Listed::Semaphore | Listed::RwLock => "sem",
        Listed::Queue => "wq",
        _ => return None,
    })
}

/// The escaped name of a key's rest after its kind's root, if that key
/// stands for state of `kind`: a claim's holder or waiter key, a named
/// lease, a semaphore's grant or waiter (not its permit slots), a queue's
/// message record.
fn name_in(kind: Listed, rest: &str) -> Option<&str> {
    match kind {
        Listed::Lease => (!rest.contains('/')).then_some(rest),
        _ => {
            let (name, tail) = rest.split_once('/')?;
            let counts = match kind {
                Listed::Semaphore | Listed::RwLock => {
                    tail.starts_with("h/") || tail.starts_with("w/")
                }
                Listed::Queue => tail.starts_with("m/"),
                _ => !tail.is_empty(),
            };
            counts.then_some(name)
        }
    }
}

#[async_trait]
impl Lister for EtcdBackend {
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        const OP: &str = "list";
        let Some(seg) = segment(kind) else {
            return Err(Error::Unsupported {
                backend: BACKEND,
                primitive: "listing",
                reason: "this kind has no names to list",
            });
        };
        let root = self.etcd.keys.root(seg);
        let start = format!("{root}{}", escape(prefix)).into_bytes();
        let end = prefix_end(&start);
        let mut from = start;
        let mut names = BTreeSet::new();
        loop {
            let opts = page_opts(&end, true);
            let mut page = self
                .etcd
                .call_kv(OP, |mut c| {
                    let (k, o) = (from.clone(), opts.clone());
                    async move { c.get(k, Some(o)).await }
                })
                .await?;
            let more = page.more();
            let kvs = page.take_kvs();
            for kv in &kvs {
                let key = String::from_utf8_lossy(kv.key());
                let found = key
                    .strip_prefix(&root)
                    .and_then(|rest| name_in(kind, rest))
                    .and_then(unescape);
                if let Some(name) = found {
                    names.insert(name);
                }
            }
            let Some(last) = kvs.last() else { break };
            if !more || names.len() >= limit {
                break;
            }
            from = last.key().to_vec();
            from.push(0);
        }
        Ok(names.into_iter().take(limit).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_counts_its_own_keys() {
        assert_eq!(name_in(Listed::Lock, "a%2Fb/7f"), Some("a%2Fb"));
        assert_eq!(name_in(Listed::Lease, "a%2Fb"), Some("a%2Fb"));
        assert_eq!(name_in(Listed::Semaphore, "s/h/7f"), Some("s"));
        assert_eq!(name_in(Listed::Semaphore, "s/s/0"), None);
        assert_eq!(
            name_in(Listed::Queue, "q/m/M/00000000000000000001"),
            Some("q")
        );
        assert_eq!(name_in(Listed::Queue, "q/c/M"), None);
        assert_eq!(unescape("a%2Fb%25").as_deref(), Some("a/b%"));
        assert_eq!(unescape("a%2"), None);
    }
}
