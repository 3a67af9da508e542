//! The health probe: `INFO server`, one round trip that reads no coord
//! state.

use coord_core::{Probe, Result, ServerInfo, async_trait};
use redis::Value;

use super::{BACKEND, RedisBackend};

/// The `redis_version` field of an `INFO` reply (a cluster may answer
/// with one reply per node: the first that has one).
pub(crate) fn version_in(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => version_in_text(&String::from_utf8_lossy(b)),
        Value::VerbatimString { text, .. } | Value::SimpleString(text) => version_in_text(text),
        Value::Array(items) | Value::Set(items) => items.iter().find_map(version_in),
        Value::Map(pairs) => pairs.iter().find_map(|(_, v)| version_in(v)),
        _ => None,
    }
}

fn version_in_text(info: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .map(|v| v.trim().to_string())
}

#[async_trait]
impl Probe for RedisBackend {
    async fn probe(&self) -> Result<ServerInfo> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("server");
        let v = self.cmd("health probe", cmd).await?;
        let version = version_in(&v).ok_or_else(|| coord_core::Error::Store {
            backend: BACKEND,
            operation: "health probe",
            message: "INFO server carried no redis_version; is this a Redis server?".into(),
            source: None,
        })?;
        Ok(ServerInfo::new(format!("redis {version}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_from_a_plain_or_a_per_node_reply() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        let plain = Value::BulkString(info.as_bytes().to_vec());
        assert_eq!(version_in(&plain).as_deref(), Some("7.0.15"));
        let per_node = Value::Map(vec![(
            Value::SimpleString("127.0.0.1:7000".into()),
            plain.clone(),
        )]);
        assert_eq!(version_in(&per_node).as_deref(), Some("7.0.15"));
        assert_eq!(version_in(&Value::Nil), None);
    }
}
