//! Key layout and error mapping.

use coord_core::util::{Kind, redact_url_passwords};
use coord_core::{Error, StoreSource};

pub(crate) const BACKEND: &str = "etcd";

/// Where every key of one client lives.
///
/// - claims (locks, elections): `<prefix><kind>/<escaped name>/<lease hex>`,
///   one key per holder or waiter, named by the lease of its claim's first
///   attempt (reused with the lease by later claims, as etcd's lock RPC
///   does), ordered by create revision; the value is `<owner hex>`, then
///   ` <metadata>` (locks) or ` <candidate>` (elections) if not empty
///   ([`claim_value`]);
/// - leases, barriers, fencing: `<prefix><kind>/<escaped name>`;
/// - limiters: `<prefix>limiter/<algorithm>/<escaped key>`;
/// - semaphores: `<prefix>sem/<escaped name>/h/<lease hex>` (grants),
///   `<prefix>sem/<escaped name>/w/<lease hex>` (queued waiters), both
///   named by a lease as claims are and with the owner's hex first in the
///   value, and `<prefix>sem/<escaped name>/s/<i>` (permit slots);
/// - work queues: everything under `<prefix>wq/<escaped name>/` (see
///   `work_queue/keys.rs`).
///
/// Names are escaped (`%` -> `%25`, `/` -> `%2F`) so that the queue of
/// `a` never contains the keys of `a/b`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
}

pub(crate) fn escape(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out
}

/// The name `escaped` stands for (see [`escape`]); `None` when it is not
/// one coord writes.
pub(crate) fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        out.push(match rest.get(i..i + 3)? {
            "%25" => '%',
            "%2F" => '/',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The smallest key greater than every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    /// `<prefix><kind>/<name>/`: the queue of a claim.
    pub(crate) fn queue(&self, kind: Kind, name: &str) -> Vec<u8> {
        format!("{}{}/{}/", self.prefix, kind.as_str(), escape(name)).into_bytes()
    }

    /// `<prefix><kind>/<name>`.
    pub(crate) fn single(&self, kind: Kind, name: &str) -> Vec<u8> {
        format!("{}{}/{}", self.prefix, kind.as_str(), escape(name)).into_bytes()
    }

    /// `<prefix>sem/<name>/`: every key of a semaphore (`h/<lease hex>`
    /// for grants, `w/<lease hex>` for queued waiters, `s/<i>` for slots).
    pub(crate) fn sem(&self, name: &str) -> Vec<u8> {
        format!("{}sem/{}/", self.prefix, escape(name)).into_bytes()
    }

    /// `<prefix>wq/<name>/`: every key of a work queue.
    pub(crate) fn wq(&self, name: &str) -> String {
        format!("{}wq/{}/", self.prefix, escape(name))
    }

    /// `<prefix><segment>/`: where every key of one kind starts (`lock`,
    /// `lease`, `election`, `sem`, `wq`).
    pub(crate) fn root(&self, segment: &str) -> String {
        format!("{}{segment}/", self.prefix)
    }

    /// `<prefix>limiter/<tag>/<key>`.
    pub(crate) fn limiter(&self, tag: &str, key: &str) -> Vec<u8> {
        format!(
            "{}{}/{}/{}",
            self.prefix,
            Kind::Limiter.as_str(),
            tag,
            escape(key)
        )
        .into_bytes()
    }
}

/// A claim's key: its queue, then the hex of `lease`, the lease its
/// claim's first attempt wrote on. Such a lease serves one claim at a
/// time, and a lease goes back to the spare pool only once its key was
/// deleted (see `client/pool.rs`), so two live claims never share a key, while a
/// busy name reuses a few keys instead of writing one per acquire.
pub(crate) fn claim_key(queue: &[u8], lease: i64) -> Vec<u8> {
    let mut key = queue.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// A claim key's value: as [`lease_value`], the owner's hex then ` ` and
/// `extra` (a lock's metadata, an election's candidate) unless it is
/// empty.
pub(crate) fn claim_value(hex: &str, extra: &[u8]) -> Vec<u8> {
    lease_value(hex, Some(extra).filter(|e| !e.is_empty()))
}

/// A named lease's value: `<owner hex>`, then ` <metadata>` if the grant
/// carries metadata (JSON, never empty). A value of the hex alone (written
/// before metadata existed, or without it) decodes as having none.
pub(crate) fn lease_value(hex: &str, metadata: Option<&[u8]>) -> Vec<u8> {
    let mut v = hex.as_bytes().to_vec();
    if let Some(m) = metadata {
        v.push(b' ');
        v.extend_from_slice(m);
    }
    v
}

/// A named lease's value split into the owner's hex and the metadata.
pub(crate) fn split_lease_value(v: &[u8]) -> (&[u8], Option<&[u8]>) {
    match v.iter().position(|b| *b == b' ') {
        Some(i) => (&v[..i], Some(&v[i + 1..]).filter(|m| !m.is_empty())),
        None => (v, None),
    }
}

/// Map an etcd client error to coord's error kinds: transport trouble and
/// timeouts are [`Error::Unavailable`] (retryable), everything else the
/// server said is [`Error::Store`]. Messages are passed through
/// [`redact_url_passwords`].
pub(crate) fn map_err(operation: &'static str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    let message = redact_url_passwords(&e.to_string());
    let unavailable = match &e {
        E::GRpcStatus(s) => {
            use tonic_code::*;
            let code = s.code() as i32;
            matches!(
                code,
                UNAVAILABLE | DEADLINE_EXCEEDED | CANCELLED | ABORTED | RESOURCE_EXHAUSTED
            ) || (code == INTERNAL && message.contains("h2 protocol error"))
                || (code == UNKNOWN
                    && (message.contains("transport")
                        || message.contains("connection")
                        || message.contains("leader")
                        || message.contains("timed out")))
        }
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) => true,
        E::LeaseKeepAliveError(m) => !m.contains("not found"),
        _ => false,
    };
    let source = Some(StoreSource::new(e, message.clone()));
    if unavailable {
        Error::Unavailable {
            backend: BACKEND,
            operation,
            message,
            source,
        }
    } else {
        Error::Store {
            backend: BACKEND,
            operation,
            message,
            source,
        }
    }
}

/// Whether the request surely never reached a member that could act on
/// it: the connection was refused, or the member has no leader. Retrying
/// such a call elsewhere is always safe.
pub(crate) fn not_sent(e: &etcd_client::Error) -> bool {
    let s = e.to_string();
    s.contains("tcp connect error")
        || s.contains("Connection refused")
        || s.contains("error trying to connect")
        || s.contains("no leader")
        // hyper gives a request back unsent when its connection closed
        // before the request was taken from the queue (a reset connection:
        // the first calls after it), or when the connection was not ready.
        || s.contains("Canceled, \"connection closed\"")
        || s.contains("connection was not ready")
}

/// gRPC status codes as numbers (so we need not depend on tonic).
mod tonic_code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const ABORTED: i32 = 10;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_keeps_queues_apart() {
        let k = Keys::new("coord:");
        assert_eq!(k.queue(Kind::Lock, "a"), b"coord:lock/a/".to_vec());
        assert_eq!(k.queue(Kind::Lock, "a/b"), b"coord:lock/a%2Fb/".to_vec());
        assert_eq!(k.single(Kind::Lease, "x%"), b"coord:lease/x%25".to_vec());
        assert_eq!(
            k.limiter("gcra", "u/1"),
            b"coord:limiter/gcra/u%2F1".to_vec()
        );
        assert_eq!(prefix_end(b"ab/"), b"ab0".to_vec());
        assert_eq!(split_lease_value(b"ab12"), (&b"ab12"[..], None));
        let v = lease_value("ab12", Some(b"{\"a\": 1}"));
        assert_eq!(
            split_lease_value(&v),
            (&b"ab12"[..], Some(&b"{\"a\": 1}"[..]))
        );
        assert_eq!(lease_value("ab12", None), b"ab12".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        let q = k.queue(Kind::Lock, "a");
        assert_eq!(
            claim_key(&q, 0x0069_4d8c_2a1f),
            b"coord:lock/a/694d8c2a1f".to_vec()
        );
        assert_eq!(claim_value("ab12", b""), b"ab12".to_vec());
        assert_eq!(
            split_lease_value(&claim_value("ab12", b"web 3")),
            (&b"ab12"[..], Some(&b"web 3"[..]))
        );
    }

    /// The client's own HTTP/2 connection broke (tonic reports it as
    /// `Internal`, "h2 protocol error": seen in the queue fault workload
    /// when the proxy dropped part of a reply, a GOAWAY PROTOCOL_ERROR):
    /// transport trouble, retryable. An `Internal` status from the server
    /// stays a store error.
    #[test]
    fn a_broken_http2_connection_is_unavailable() {
        use tonic::{Code, Status};
        let broken = etcd_client::Error::GRpcStatus(Status::new(
            Code::Internal,
            "h2 protocol error: http2 error",
        ));
        assert!(
            matches!(map_err("queue pop", broken), Error::Unavailable { .. }),
            "a broken HTTP/2 connection is not retryable"
        );
        let server = etcd_client::Error::GRpcStatus(Status::new(
            Code::Internal,
            "etcdserver: unexpected error",
        ));
        assert!(matches!(map_err("queue pop", server), Error::Store { .. }));
    }
}
