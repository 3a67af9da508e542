//! Listing names (`coord ls`): `SCAN` with a `MATCH` pattern on the
//! server, or on every master of a Cluster, in bounded steps; never
//! `KEYS`, which blocks the server while it walks every key.

use std::collections::BTreeSet;

use coord_core::util::Kind;
use coord_core::{Error, Listed, Lister, Result, async_trait};
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::connection::Conn;
use super::{BACKEND, RedisBackend};
use crate::Layout;
use crate::keys::{QUEUE, SEMAPHORE, push_tag, untag};

/// Keys one `SCAN` step looks at.
const SCAN_COUNT: u32 = 1000;

/// A master of a Cluster, by address; `None`: the one server.
type Node = Option<(String, u16)>;

/// `s` with the glob characters of `MATCH` escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether a key with `suffix` after the name's hash tag stands for state
/// of `kind`: a lock, a lease and a leader their claim, a queue with
/// messages the id index of a lane; every key of a semaphore counts.
fn counts(kind: Listed, suffix: &str) -> bool {
    match kind {
        Listed::Lock | Listed::Lease | Listed::Election => suffix.is_empty(),
        Listed::Queue => suffix == ":main:ids" || suffix == ":dead:ids",
        _ => true,
    }
}

/// The text before the hash tag of every key of `kind`.
fn segment(kind: Listed) -> Option<&'static str> {
    Some(match kind {
        Listed::Lock => Kind::Lock.as_str(),
        Listed::Lease => Kind::Lease.as_str(),
        Listed::Election => Kind::Election.as_str(),
        Listed::Semaphore | Listed::RwLock => SEMAPHORE,
        Listed::Queue => QUEUE,
        _ => return None,
    })
}

/// The cursor and keys of a `SCAN` reply.
fn scan_reply(v: &Value) -> Option<(String, Vec<String>)> {
    let Value::Array(parts) = v else {
        return None;
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let cursor = text(parts.first()?)?;
    let Value::Array(keys) = parts.get(1)? else {
        return None;
    };
    Some((cursor, keys.iter().filter_map(text).collect()))
}

/// The masters of a Cluster from a `CLUSTER NODES` reply.
fn masters(nodes: &str) -> Vec<Node> {
    nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags = f.get(2)?;
            if !flags.split(',').any(|x| x == "master")
                || flags.split(',').any(|x| x == "fail" || x == "noaddr")
            {
                return None;
            }
            let addr = f.get(1)?.split(['@', ',']).next()?;
            let (host, port) = addr.rsplit_once(':')?;
            Some(Some((host.to_string(), port.parse().ok()?)))
        })
        .collect()
}

impl RedisBackend {
    /// `cmd` on `node` (a Cluster master by address), bounded like every
    /// call.
    async fn on_node(&self, op: &'static str, cmd: redis::Cmd, node: &Node) -> Result<Value> {
        let Some((host, port)) = node else {
            return self.cmd(op, cmd).await;
        };
        let (generation, conn) = self.conn.get();
        let Conn::Cluster(mut c) = conn else {
            return self.cmd(op, cmd).await;
        };
        let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: host.clone(),
            port: *port,
        });
        self.bounded(op, generation, async move {
            c.route_command(cmd, to)
                .await
                .and_then(Value::extract_error)
        })
        .await
    }

    /// The nodes to scan: every master of a Cluster, else the server.
    async fn scan_nodes(&self) -> Result<Vec<Node>> {
        let (_, conn) = self.conn.get();
        if !matches!(conn, Conn::Cluster(_)) {
            return Ok(vec![None]);
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let text = match self.cmd("list", cmd).await? {
            Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            Value::VerbatimString { text, .. } | Value::SimpleString(text) => text,
            other => return Err(unexpected(&other)),
        };
        let found = masters(&text);
        if found.is_empty() {
            return Err(unexpected(&Value::SimpleString(text)));
        }
        Ok(found)
    }
}

fn unexpected(v: &Value) -> Error {
    Error::Store {
        backend: BACKEND,
        operation: "list",
        message: format!("unexpected reply {v:?}"),
        source: None,
    }
}

#[async_trait]
impl Lister for RedisBackend {
    async fn names(&self, kind: Listed, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let Some(seg) = segment(kind) else {
            return Err(kind.unlisted(BACKEND));
        };
        if kind == Listed::Lock && self.keys.layout == Layout::Php {
            return Err(Error::Unsupported {
                backend: BACKEND,
                primitive: "listing locks",
                reason: "locks of the PHP layout are bare keys, which cannot be told apart \
                         from other keys (a lock the PHP class holds has no key of coord's)",
            });
        }
        let head = format!("{}{seg}:{{", self.keys.prefix);
        let mut tag = String::new();
        push_tag(&mut tag, prefix);
        let pattern = format!("{}{}*", glob_escape(&head), glob_escape(&tag));
        let mut names = BTreeSet::new();
        for node in self.scan_nodes().await? {
            let mut cursor = "0".to_string();
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(&cursor).arg("MATCH").arg(&pattern);
                cmd.arg("COUNT").arg(SCAN_COUNT);
                let v = self.on_node("list", cmd, &node).await?;
                let (next, keys) = scan_reply(&v).ok_or_else(|| unexpected(&v))?;
                for key in keys {
                    let Some(rest) = key.strip_prefix(&head) else {
                        continue;
                    };
                    let Some((tag, suffix)) = rest.split_once('}') else {
                        continue;
                    };
                    if counts(kind, suffix)
                        && let Some(name) = untag(tag)
                    {
                        names.insert(name);
                    }
                }
                if next == "0" || names.len() >= limit {
                    break;
                }
                cursor = next;
            }
            if names.len() >= limit {
                break;
            }
        }
        Ok(names.into_iter().take(limit).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
    }

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let nodes = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 0 1 connected
e7d1 127.0.0.1:30001@31001,host.one myself,master - 0 0 1 connected 0-5460
67ed 127.0.0.1:30002@31002 master - 0 0 2 connected 5461-10922
2926 127.0.0.1:30003@31003 master,fail - 0 0 3 disconnected
";
        assert_eq!(
            masters(nodes),
            vec![
                Some(("127.0.0.1".to_string(), 30001)),
                Some(("127.0.0.1".to_string(), 30002)),
            ]
        );
    }

    #[test]
    fn a_scan_reply_gives_its_cursor_and_keys() {
        let v = Value::Array(vec![
            Value::BulkString(b"17".to_vec()),
            Value::Array(vec![Value::BulkString(b"coord:lock:{a}".to_vec())]),
        ]);
        assert_eq!(
            scan_reply(&v),
            Some(("17".to_string(), vec!["coord:lock:{a}".to_string()]))
        );
        assert_eq!(scan_reply(&Value::Nil), None);
    }

    #[test]
    fn each_kind_counts_its_own_keys() {
        assert!(counts(Listed::Lock, "") && !counts(Listed::Lock, ":fence"));
        assert!(!counts(Listed::Lock, ":left:00ff"));
        assert!(counts(Listed::Queue, ":main:ids") && !counts(Listed::Queue, ""));
        assert!(counts(Listed::Semaphore, ":holders"));
    }

    /// A backend with a key prefix of its own on the shared test server.
    async fn coord_on(layout: crate::Layout) -> (coord_core::Coord, String) {
        let prefix = format!("{}:", conformance::unique("ls-review"));
        let url = conformance::testkit::redis::url();
        let b = RedisBackend::connect(
            crate::RedisOptions::new(&url)
                .prefix(prefix.clone())
                .layout(layout),
        )
        .await
        .expect("connect to the test redis-server");
        (b.into_coord(), prefix)
    }

    /// Layout::Php: a lock the PHP `RedisLock` class holds (its bare key,
    /// `SET <name> <token> NX EX`) is either listed or the listing is
    /// refused as `Unsupported`, as `Coord::list` documents ("a Redis lock
    /// in the PHP layout, whose keys are bare names"), never silently
    /// left out.
    #[tokio::test]
    async fn list_names_php_layout_lock_held_by_php_is_listed_or_unsupported() {
        let (coord, _) = coord_on(crate::Layout::Php).await;
        let name = conformance::unique("php-held");
        let server = conformance::testkit::redis::server();
        server.command(&[
            "SET",
            &name,
            "0123456789abcdef0123456789abcdef",
            "NX",
            "EX",
            "60",
        ]);
        let got = coord.list(Listed::Lock, &name, 10).await;
        server.command(&["DEL", &name]);
        match got {
            Err(Error::Unsupported { .. }) => {}
            Ok(names) => assert_eq!(
                names,
                std::slice::from_ref(&name),
                "PHP-held lock not listed"
            ),
            Err(e) => panic!("{e}"),
        }
    }

    /// `list(Semaphore, "", 1)` with one semaphore and one read-write
    /// lock held lists the semaphore: the read-write lock's semaphore
    /// name (`\u{1}rw\u{1}...`) does not take the only place.
    #[tokio::test]
    async fn list_names_semaphore_limit_not_taken_by_rwlocks() {
        use std::time::Duration;
        let (coord, _) = coord_on(crate::Layout::Coord).await;
        let ttl = Duration::from_secs(60);
        let p = coord
            .semaphores()
            .unwrap()
            .try_acquire("sem", 2, ttl)
            .await
            .unwrap()
            .expect("free permit");
        let r = coord
            .rw_locks()
            .unwrap()
            .read("rw", ttl, Duration::ZERO)
            .await
            .unwrap();
        let got = coord.list(Listed::Semaphore, "", 1).await.unwrap();
        p.release().await.unwrap();
        r.release().await.unwrap();
        assert_eq!(got, ["sem"], "a limit of 1 with a semaphore held");
    }

    /// Names with every character the key encodings touch, under prefixes
    /// that end inside what an escape would be (sanity check).
    #[tokio::test]
    async fn list_names_odd_characters_round_trip() {
        use std::time::Duration;
        let (coord, _) = coord_on(crate::Layout::Coord).await;
        let ttl = Duration::from_secs(60);
        let names = [
            "a%", "a%7B", "a{", "a}", "a*b", "a?", "a[x]", "a\\", "a%25", "a/b", "a:b}c",
        ];
        let mut held = Vec::new();
        for n in names {
            held.push(
                coord
                    .locks()
                    .unwrap()
                    .try_acquire(n, ttl)
                    .await
                    .unwrap()
                    .expect(n),
            );
        }
        let mut want: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(coord.list(Listed::Lock, "a", 100).await.unwrap(), want);
        assert_eq!(
            coord.list(Listed::Lock, "a%", 100).await.unwrap(),
            ["a%", "a%25", "a%7B"]
        );
        assert_eq!(
            coord.list(Listed::Lock, "a%2", 100).await.unwrap(),
            ["a%25"]
        );
        assert_eq!(coord.list(Listed::Lock, "a[", 100).await.unwrap(), ["a[x]"]);
        assert_eq!(coord.list(Listed::Lock, "a\\", 100).await.unwrap(), ["a\\"]);
        assert_eq!(coord.list(Listed::Lock, "a*", 100).await.unwrap(), ["a*b"]);
        for g in held {
            g.release().await.unwrap();
        }
    }
}
