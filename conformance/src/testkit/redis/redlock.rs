//! Redlock masters for tests: three independent `redis-server`s (no
//! replication between them) on free loopback ports, reached through a
//! `redlock://` URL. [`redlock()`] is the shared set of a test binary,
//! started on first use; [`RedlockMasters::start`] a private set (for tests
//! that stop masters or cut them off behind a fault proxy).

use std::sync::OnceLock;

use super::RedisServer;
use crate::testkit::proxy::FaultProxy;

/// Independent masters, each optionally behind its own [`FaultProxy`].
#[derive(Debug)]
pub struct RedlockMasters {
    masters: Vec<RedisServer>,
    proxies: Vec<FaultProxy>,
}

/// The shared set of this test binary (three masters, no proxies).
pub fn redlock() -> &'static RedlockMasters {
    static SET: OnceLock<RedlockMasters> = OnceLock::new();
    SET.get_or_init(|| RedlockMasters::start(3))
}

impl RedlockMasters {
    /// Start `n` independent masters.
    pub fn start(n: usize) -> RedlockMasters {
        RedlockMasters {
            masters: (0..n).map(|_| RedisServer::start()).collect(),
            proxies: Vec::new(),
        }
    }

    /// Start `n` independent masters, each reached through its own fault
    /// proxy (see [`Self::proxy`]), with `appendonly`/`appendfsync always`
    /// so a master can be killed and started again with its data.
    pub fn start_behind_proxies(n: usize) -> RedlockMasters {
        let masters: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_with_aof()).collect();
        let proxies = masters
            .iter()
            .map(|m| FaultProxy::start(m.port()))
            .collect();
        RedlockMasters { masters, proxies }
    }

    /// The `redlock://` URL listing every master (through its proxy, if
    /// any).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = match self.proxies.is_empty() {
            true => self
                .masters
                .iter()
                .map(|m| format!("127.0.0.1:{}", m.port()))
                .collect(),
            false => self
                .proxies
                .iter()
                .map(|p| format!("127.0.0.1:{}", p.port()))
                .collect(),
        };
        format!("redlock://{}", hosts.join(","))
    }

    /// The masters, in URL order.
    pub fn masters(&self) -> &[RedisServer] {
        &self.masters
    }

    /// The fault proxy in front of master `i` (panics without proxies).
    pub fn proxy(&self, i: usize) -> &FaultProxy {
        &self.proxies[i]
    }
}
