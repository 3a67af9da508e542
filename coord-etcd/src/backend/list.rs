//! Listing names (`coord ls`): range reads of one kind's keys under the
//! escaped prefix, keys only, a page at a time.

use std::collections::BTreeSet;

use coord_core::util::Kind;
use coord_core::{Listed, Lister, Result, async_trait};
use etcd_client::GetOptions;

use crate::backend::EtcdBackend;
use crate::client::keys::{BACKEND, escape, prefix_end, unescape};

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

#[async_trait]
impl Lister for EtcdBackend {
    /// One name at a time: the first key at or after where the last name's
    /// keys end, then (for semaphores and queues) a check for a key that
    /// counts, then on past every key of that name. A few reads per name,
    /// however many keys (messages, waiters) a name has.
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        const OP: &str = "list";
        let Some(seg) = segment(kind) else {
            return Err(kind.unlisted(BACKEND));
        };
        let root = self.etcd.keys.root(seg);
        let start = format!("{root}{}", escape(prefix)).into_bytes();
        let end = prefix_end(&start);
        let mut from = start;
        let mut names = BTreeSet::new();
        while names.len() < limit {
            let Some(key) = self.first_key(OP, &from, &end).await? else {
                break;
            };
            let key = String::from_utf8_lossy(&key).into_owned();
            let Some(rest) = key.strip_prefix(&root) else {
                break;
            };
            let (escaped, folder) = match rest.split_once('/') {
                Some((escaped, _)) => (escaped, Some(format!("{root}{escaped}/"))),
                None => (rest, None),
            };
            let counts = match (kind, &folder) {
                (Listed::Lease, f) => f.is_none(),
                (Listed::Semaphore | Listed::RwLock, Some(f)) => {
                    self.has_key(OP, &format!("{f}h/")).await?
                        || self.has_key(OP, &format!("{f}w/")).await?
                }
                (Listed::Queue, Some(f)) => self.has_key(OP, &format!("{f}m/")).await?,
                (_, f) => f.is_some(),
            };
            if counts && let Some(name) = unescape(escaped) {
                names.insert(name);
            }
            from = match folder {
                Some(f) => prefix_end(f.as_bytes()),
                None => {
                    let mut next = key.into_bytes();
                    next.push(0);
                    next
                }
            };
        }
        Ok(names.into_iter().collect())
    }
}

impl EtcdBackend {
    /// The first key in `[from, end)`, if any: one keys-only read.
    async fn first_key(
        &self,
        op: &'static str,
        from: &[u8],
        end: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        let opts = GetOptions::new()
            .with_range(end.to_vec())
            .with_keys_only()
            .with_limit(1);
        let kvs = self.etcd.get(op, from.to_vec(), Some(opts)).await?;
        Ok(kvs.first().map(|kv| kv.key().to_vec()))
    }

    /// Whether some key starts with `prefix`: one keys-only read.
    async fn has_key(&self, op: &'static str, prefix: &str) -> Result<bool> {
        let end = prefix_end(prefix.as_bytes());
        Ok(self.first_key(op, prefix.as_bytes(), &end).await?.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_come_back() {
        assert_eq!(unescape("a%2Fb%25").as_deref(), Some("a/b%"));
        assert_eq!(unescape("a%2"), None);
    }

    /// Listing queues costs a few reads per name, none per message: with
    /// 30,000 keys under queue `a` (more than a page), `list(Queue, "",
    /// 2)` finds `a` and `b` in a handful of reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn list_names_work_does_not_grow_with_a_queues_messages() {
        use conformance::testkit::etcd::EtcdServer;
        use etcd_client::{Client, Txn, TxnOp};
        let server = tokio::task::spawn_blocking(EtcdServer::start)
            .await
            .unwrap();
        let prefix = "lsreview:";
        let mut kv = Client::connect([server.endpoint()], None)
            .await
            .unwrap()
            .kv_client();
        let mut keys = vec![format!("{prefix}wq/a/m/M/{:020}", 1)];
        keys.extend((0..30_000).map(|i| format!("{prefix}wq/a/p/M/{i:020}")));
        keys.push(format!("{prefix}wq/b/m/M/{:020}", 1));
        for chunk in keys.chunks(128) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|k| TxnOp::put(k.as_str(), "", None))
                .collect();
            kv.txn(Txn::new().and_then(ops)).await.unwrap();
        }
        let b =
            EtcdBackend::connect(crate::EtcdOptions::new([server.endpoint()]).with_prefix(prefix))
                .await
                .unwrap();
        let coord = b.coord();
        let ranges = || server.metric("grpc_server_handled_total", &["grpc_method=\"Range\""]);
        let before = ranges();
        let names = coord.list(Listed::Queue, "", 2).await.unwrap();
        let reads = ranges() - before;
        assert_eq!(names, ["a", "b"]);
        assert!(reads <= 6.0, "{reads} range reads to list 2 queue names");
    }
}
