//! A member's raft status through etcd's JSON gateway (on its client
//! port): its current raft term. A term that moved between two readings
//! means the leadership was interrupted in between (an election, won by
//! the same member or another), even if the same member leads at both.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::EtcdCluster;

/// One plain POST of `body` (JSON) on `127.0.0.1:port`; the body of the
/// answer, or `None`.
fn http_post(port: u16, path: &str, body: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().ok()?,
        Duration::from_secs(1),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.") && head.contains(" 200 ")).then(|| body.to_string())
}

/// The largest raft term named in a status answer (the header's
/// `raft_term` and the status's own `raftTerm`, both the member's current
/// term).
fn term_of(json: &str) -> Option<u64> {
    ["\"raft_term\":\"", "\"raftTerm\":\""]
        .iter()
        .flat_map(|field| json.match_indices(field).map(move |(i, _)| i + field.len()))
        .filter_map(|at| {
            let digits: String = json[at..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .max()
}

impl EtcdCluster {
    /// The raft term member `i` is in, if it answers (a frozen or stopped
    /// member does not; one that is frozen makes this wait a few seconds).
    pub fn raft_term(&self, i: usize) -> Option<u64> {
        if !self.is_running(i) {
            return None;
        }
        let body = http_post(self.client_port(i), "/v3/maintenance/status", "{}")?;
        term_of(&body)
    }

    /// [`raft_term`](Self::raft_term) of every member, in order.
    pub fn raft_terms(&self) -> Vec<Option<u64>> {
        (0..self.len()).map(|i| self.raft_term(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::term_of;

    #[test]
    fn the_largest_term_named_is_read() {
        let json = r#"{"header":{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"4"},"version":"3.4.23","leader":"7","raftIndex":"30","raftTerm":"5"}"#;
        assert_eq!(term_of(json), Some(5));
        assert_eq!(term_of(r#"{"header":{"raft_term":"12"}}"#), Some(12));
        assert_eq!(term_of("{}"), None);
    }
}
