//! Where each primitive's state lives: the key layout.

use coord_core::util::Kind;

/// How keys are named in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Layout {
    /// `prefix + kind + ":{" + name + "}" [+ ":" + suffix]`, for example
    /// `coord:lock:{orders}` and its fencing counter `coord:lock:{orders}:fence`.
    /// The name sits inside a hash tag, so every key one script touches
    /// hashes to the same Redis Cluster slot. The default.
    #[default]
    Coord,
    /// The seed PHP `RedisLock`'s exact keys, so a service still running it
    /// and a Rust service using coord lock each other out:
    ///
    /// - a lock is the key `<name>` holding the holder's random token (PHP:
    ///   `SET <name> <token> NX EX <ttl>`); coord writes its owner token as 32
    ///   hex digits, as PHP's `bin2hex(random_bytes(16))` does;
    /// - its fencing counter is `fencing_token_<name>` (PHP:
    ///   `INCR fencing_token_<resource>`), shared with the fencing source of
    ///   the same resource;
    /// - the sliding-log limiter is the ZSET `<key>`, scored in seconds as
    ///   PHP's `microtime(true)` writes them.
    ///
    /// What the seed has no key for (the grant's fencing token kept beside a
    /// lock, leases, elections, barriers, the other limiter algorithms) uses
    /// the [`Layout::Coord`] keys under the prefix. These keys have no common
    /// hash tag: this layout is for a single Redis server, not a Cluster.
    Seed,
}

/// Builds every key from the prefix and layout.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub prefix: String,
    pub layout: Layout,
}

impl Keys {
    /// `prefix + kind + ":{" + name + "}" + suffix`. The suffixes used never
    /// end in `}`, so keys of different names can never coincide.
    fn key(&self, kind: Kind, name: &str, suffix: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 12 + name.len() + suffix.len());
        k.push_str(&self.prefix);
        k.push_str(kind.as_str());
        k.push_str(":{");
        k.push_str(name);
        k.push('}');
        k.push_str(suffix);
        k
    }

    /// The channel every wake-up of this prefix is published on.
    pub fn channel(&self) -> String {
        format!("{}wake", self.prefix)
    }

    /// The wake-up payload (and local registry key) of a name.
    pub fn wake(kind: Kind, name: &str) -> String {
        format!("{}:{}", kind.as_str(), name)
    }

    /// A lock: claim, grant, counter.
    pub fn lock(&self, name: &str) -> [String; 3] {
        match self.layout {
            Layout::Coord => [
                self.key(Kind::Lock, name, ""),
                self.key(Kind::Lock, name, ":grant"),
                self.key(Kind::Lock, name, ":fence"),
            ],
            Layout::Seed => [
                name.to_string(),
                self.key(Kind::Lock, name, ":grant"),
                format!("fencing_token_{name}"),
            ],
        }
    }

    /// A lease: claim, grant, counter.
    pub fn lease(&self, name: &str) -> [String; 3] {
        [
            self.key(Kind::Lease, name, ""),
            self.key(Kind::Lease, name, ":grant"),
            self.key(Kind::Lease, name, ":fence"),
        ]
    }

    /// A fencing source's counter.
    pub fn fence(&self, resource: &str) -> String {
        match self.layout {
            Layout::Coord => self.key(Kind::Fence, resource, ""),
            Layout::Seed => format!("fencing_token_{resource}"),
        }
    }

    /// An election: state hash, term counter.
    pub fn election(&self, name: &str) -> [String; 2] {
        [
            self.key(Kind::Election, name, ""),
            self.key(Kind::Election, name, ":term"),
        ]
    }

    /// A barrier: state hash, members of the open generation.
    pub fn barrier(&self, name: &str) -> [String; 2] {
        [
            self.key(Kind::Barrier, name, ""),
            self.key(Kind::Barrier, name, ":open"),
        ]
    }

    /// A limiter's state for one algorithm (`log`, `sw`, `fw`, `gcra`).
    pub fn limiter(&self, key: &str, algorithm: &str) -> String {
        if self.layout == Layout::Seed && algorithm == "log" {
            return key.to_string();
        }
        let suffix = format!(":{algorithm}");
        self.key(Kind::Limiter, key, &suffix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coord_layout_uses_hash_tags() {
        let k = Keys {
            prefix: "coord:".into(),
            layout: Layout::Coord,
        };
        assert_eq!(
            k.lock("orders"),
            [
                "coord:lock:{orders}".to_string(),
                "coord:lock:{orders}:grant".to_string(),
                "coord:lock:{orders}:fence".to_string()
            ]
        );
        assert_eq!(k.limiter("api", "log"), "coord:limiter:{api}:log");
        assert_eq!(k.fence("db"), "coord:fence:{db}");
        assert_eq!(k.channel(), "coord:wake");
    }

    #[test]
    fn seed_layout_uses_the_seeds_keys() {
        let k = Keys {
            prefix: "coord:".into(),
            layout: Layout::Seed,
        };
        let [lock, _, counter] = k.lock("order_process_7");
        assert_eq!(lock, "order_process_7");
        assert_eq!(counter, "fencing_token_order_process_7");
        assert_eq!(k.fence("order_process_7"), counter);
        assert_eq!(k.limiter("api:user1", "log"), "api:user1");
        assert_eq!(
            k.limiter("api:user1", "gcra"),
            "coord:limiter:{api:user1}:gcra"
        );
    }
}
