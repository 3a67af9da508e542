//! Where each primitive's state lives: the key layout.

use coord_core::util::Kind;
use coord_core::{Error, Result};

/// The key segment of a semaphore (coord-core has no [`Kind`] for it).
pub(crate) const SEMAPHORE: &str = "semaphore";

/// The key segment of a work queue (coord-core has no [`Kind`] for it).
pub(crate) const QUEUE: &str = "queue";

/// The suffixes of one lane's keys (see [`Keys::queue`]).
const QUEUE_LANE: [&str; 9] = [
    ":meta", ":ids", ":all", ":ready", ":delayed", ":flight", ":groups", ":turns", ":ordered",
];

/// The PHP original's fencing counter of a lock: `fencing_token_<name>`.
const PHP_COUNTER: &str = "fencing_token_";

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
    /// the PHP `RedisLock` class's exact keys, so a service still running it
    /// and a Rust service using coord lock each other out:
    ///
    /// - a lock is the key `<name>` holding the holder's random token (PHP:
    ///   `SET <name> <token> NX EX <ttl>`); coord writes its owner token as 32
    ///   hex digits, as PHP's `bin2hex(random_bytes(16))` does;
    /// - its fencing counter is `fencing_token_<name>` (PHP:
    ///   `INCR fencing_token_<resource>`), shared with the fencing source of
    ///   the same resource;
    /// - the sliding-log limiter is the ZSET `<key>`, scored in seconds as
    ///   PHP's `microtime(true)` writes them, one member per request. Each
    ///   PHP member counts 1 for coord; a coord request of cost k is ONE
    ///   member (`<id>*<k>`, its cost kept in coord's own keys beside it),
    ///   so the PHP, which counts members, counts it as 1.
    ///
    /// What the PHP class has no key for (the grant's fencing token kept beside a
    /// lock, with the grant's holder metadata if any, leases, elections, barriers, the other limiter algorithms, the
    /// sliding log's cost bookkeeping) uses the [`Layout::Coord`] keys under
    /// the prefix. These keys have no common hash tag: this layout is for a
    /// single Redis server, not a Cluster.
    ///
    /// Which keys are shared, and what is refused: only the PHP original's own kinds
    /// share keys, as the PHP class does (lock `X` and fencing source `X` share
    /// the counter `fencing_token_X`). Every name that would make two
    /// different things share a key is refused with
    /// [`Error::InvalidArgument`] (field `name`, or `key` for a limiter):
    ///
    /// - a lock name or sliding-log key starting with `fencing_token_` (it
    ///   would be another lock's counter), refused before any I/O;
    /// - a lock name or sliding-log key that spells a coord key under the
    ///   prefix (`<prefix><kind>:{...`), refused before any I/O;
    /// - a lock `X` and a sliding-log limiter `X` both use the key `X` (a
    ///   string and a sorted set): whichever comes second is refused while
    ///   the other's key exists (Redis' `WRONGTYPE`, turned into
    ///   `InvalidArgument`), and neither's state is touched. Use distinct
    ///   names for locks and limiters, as the PHP original's callers do.
    Php,
}

/// Where a claim (lock or lease) lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimKeys {
    /// One key holding `<owner>:<token>` (`<owner>:<token>~<metadata>~`
    /// with holder metadata) while held and `=<token>` for the rest of the
    /// TTL after a release (see `scripts::ACQUIRE`).
    One(String),
    /// [`Layout::Php`]: the claim holding the bare owner token, the
    /// grant's token beside it (`<token>~<owner>~<metadata>~` with holder
    /// metadata), and the PHP original's fencing counter.
    Php([String; 3]),
}

impl ClaimKeys {
    /// The key that holds the claim itself.
    pub fn claim(&self) -> &str {
        match self {
            ClaimKeys::One(k) => k,
            ClaimKeys::Php(k) => &k[0],
        }
    }

    /// The mark `owner` (32 hex digits) leaves against late copies of its
    /// attempts (`coord_core::late`, see `scripts::late`):
    /// `<claim>:left:<owner>`, in the claim's hash slot; in
    /// [`Layout::Php`] beside the grant key, under the prefix.
    pub fn left(&self, owner: &str) -> String {
        let base = match self {
            ClaimKeys::One(k) => k.as_str(),
            ClaimKeys::Php(k) => k[1].strip_suffix(":grant").unwrap_or(&k[1]),
        };
        left_key(base, owner)
    }
}

/// `<base>:left:<owner>`: the mark of an owner that left a claim (or an
/// election) while one of its attempts went unanswered.
pub(crate) fn left_key(base: &str, owner: &str) -> String {
    let mut k = String::with_capacity(base.len() + 6 + owner.len());
    k.push_str(base);
    k.push_str(":left:");
    k.push_str(owner);
    k
}

/// Append `name` as it stands in a key's hash tag: `%`, `{` and `}`
/// percent-encoded (`%25`, `%7B`, `%7D`), every other byte kept (see
/// [`Keys::segment_key`]). A prefix of a name encodes to a prefix of its
/// encoding.
pub(crate) fn push_tag(k: &mut String, name: &str) {
    for c in name.chars() {
        match c {
            '%' => k.push_str("%25"),
            '{' => k.push_str("%7B"),
            '}' => k.push_str("%7D"),
            c => k.push(c),
        }
    }
}

/// The name in hash tag `tag` (see [`push_tag`]); `None` when it is not
/// one coord writes.
pub(crate) fn untag(tag: &str) -> Option<String> {
    let mut out = String::with_capacity(tag.len());
    let mut rest = tag;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i..i + 3)?;
        out.push(match code {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Builds every key from the prefix and layout.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub prefix: String,
    pub layout: Layout,
}

impl Keys {
    /// `prefix + kind + ":{" + tag(name) + "}" + suffix`, where `tag`
    /// percent-encodes `%`, `{` and `}` (`%25`, `%7B`, `%7D`) and keeps every
    /// other byte. So the hash tag never contains a brace: it is the whole
    /// encoded name for every valid name (Redis Cluster hashes the text
    /// between the first `{` and the next `}`), and every key of one
    /// instance lands in one slot. (A prefix containing `{` moves the tag
    /// into the prefix; the keys of one instance still share one slot,
    /// unless that `{` is followed at once by `}`: an empty tag, which
    /// Redis ignores, hashing each key whole. A cluster client refuses
    /// such a prefix.)
    /// The encoding is injective and the suffixes never contain `}`, so
    /// keys of different names never coincide.
    fn key(&self, kind: Kind, name: &str, suffix: &str) -> String {
        self.segment_key(kind.as_str(), name, suffix)
    }

    /// [`Keys::key`] for a segment given as text.
    fn segment_key(&self, segment: &str, name: &str, suffix: &str) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 12 + name.len() + suffix.len());
        k.push_str(&self.prefix);
        k.push_str(segment);
        k.push_str(":{");
        push_tag(&mut k, name);
        k.push('}');
        k.push_str(suffix);
        k
    }

    /// In [`Layout::Php`], refuse a name used as a bare key (a lock, a
    /// sliding-log limiter) that would be another thing's key.
    fn php_bare(&self, field: &'static str, name: &str) -> Result<()> {
        if let Some(lock) = name.strip_prefix(PHP_COUNTER) {
            return Err(Error::invalid(
                field,
                format!(
                    "`{name}` starts with `{PHP_COUNTER}`: in Layout::Php that is the \
                     fencing counter of the lock `{lock}`; choose a name without that prefix"
                ),
            ));
        }
        if let Some(rest) = name.strip_prefix(self.prefix.as_str()) {
            if let Some(kind) = Kind::ALL
                .iter()
                .map(|k| k.as_str())
                .chain([SEMAPHORE, QUEUE])
                .find(|k| rest.starts_with(&format!("{k}:{{")))
            {
                return Err(Error::invalid(
                    field,
                    format!(
                        "`{name}` spells a key of a coord {} under the prefix `{}`; in \
                         Layout::Php such names would share that key. Choose another name",
                        kind, self.prefix
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The channel every wake-up of this prefix is published on.
    pub fn channel(&self) -> String {
        format!("{}wake", self.prefix)
    }

    /// The wake-up payload (and local registry key) of a name.
    pub fn wake(kind: Kind, name: &str) -> String {
        format!("{}:{}", kind.as_str(), name)
    }

    /// A lock's keys. In [`Layout::Php`], names that would collide are
    /// refused (see there).
    pub fn lock(&self, name: &str) -> Result<ClaimKeys> {
        Ok(match self.layout {
            Layout::Coord => ClaimKeys::One(self.key(Kind::Lock, name, "")),
            Layout::Php => {
                self.php_bare("name", name)?;
                ClaimKeys::Php([
                    name.to_string(),
                    self.key(Kind::Lock, name, ":grant"),
                    format!("{PHP_COUNTER}{name}"),
                ])
            }
        })
    }

    /// A lease's key (leases always use the default layout).
    pub fn lease(&self, name: &str) -> ClaimKeys {
        ClaimKeys::One(self.key(Kind::Lease, name, ""))
    }

    /// A fencing source's counter.
    pub fn fence(&self, resource: &str) -> String {
        match self.layout {
            Layout::Coord => self.key(Kind::Fence, resource, ""),
            Layout::Php => format!("{PHP_COUNTER}{resource}"),
        }
    }

    /// An election: its state hash (owner, candidate, term; after a
    /// resignation only the last term, until the TTL ends).
    pub fn election(&self, name: &str) -> [String; 1] {
        [self.key(Kind::Election, name, "")]
    }

    /// A barrier: state hash, members of the open generation, their
    /// arrival ids (id -> participant; an empty participant marks a
    /// withdrawn id), and the arrival ids of the generation that completed
    /// last.
    pub fn barrier(&self, name: &str) -> [String; 4] {
        [
            self.key(Kind::Barrier, name, ""),
            self.key(Kind::Barrier, name, ":open"),
            self.key(Kind::Barrier, name, ":ids"),
            self.key(Kind::Barrier, name, ":done"),
        ]
    }

    /// A semaphore (every layout uses these keys, as leases do): its state
    /// hash (total, permits held, permits queued, last token, queue
    /// sequence, last woken place), its grants (ZSET owner -> expiry ms, and
    /// hash owner -> `<permits>:<token>`) and its queue (ZSET owner ->
    /// arrival, ZSET owner -> expiry ms, hash owner -> permits), and the
    /// short-lived markers of owners that left without holding (ZSET owner
    /// -> expiry ms, hash owner -> the release's stamp).
    pub fn semaphore(&self, name: &str) -> [String; 8] {
        [
            "",
            ":grants",
            ":holders",
            ":queue",
            ":queue-expiry",
            ":queue-permits",
            ":left",
            ":left-at",
        ]
        .map(|suffix| self.segment_key(SEMAPHORE, name, suffix))
    }

    /// A work queue (every layout uses these keys, as leases do), in the
    /// order `lua/queue_prelude.lua` describes them: its state hash (last
    /// id, last token, the lanes' clocks and waiting marks), the bodies,
    /// the dedup ids and their expiry, then nine keys per lane (`:main...`
    /// and `:dead...`): meta, ids, all and ready (by group), delayed, in
    /// flight, groups, turns and ordered turns.
    pub fn queue(&self, name: &str) -> Vec<String> {
        let mut keys: Vec<String> = ["", ":bodies", ":dedup", ":dedup-expiry"]
            .iter()
            .map(|suffix| self.segment_key(QUEUE, name, suffix))
            .collect();
        for lane in [":main", ":dead"] {
            for suffix in QUEUE_LANE {
                keys.push(self.segment_key(QUEUE, name, &format!("{lane}{suffix}")));
            }
        }
        keys
    }

    /// A limiter's state for one algorithm (`log`, `sw`, `fw`, `gcra`). In
    /// [`Layout::Php`], the sliding log is the bare key, and keys that would
    /// collide are refused (see there).
    pub fn limiter(&self, key: &str, algorithm: &str) -> Result<String> {
        if self.layout == Layout::Php && algorithm == "log" {
            self.php_bare("key", key)?;
            return Ok(key.to_string());
        }
        Ok(self.limiter_aux(key, algorithm))
    }

    /// A limiter's key under the prefix, whatever the layout.
    pub fn limiter_aux(&self, key: &str, suffix: &str) -> String {
        let suffix = format!(":{suffix}");
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
            k.lock("orders").unwrap(),
            ClaimKeys::One("coord:lock:{orders}".to_string())
        );
        assert_eq!(k.lease("w7").claim(), "coord:lease:{w7}");
        assert_eq!(k.election("main"), ["coord:election:{main}".to_string()]);
        assert_eq!(
            k.lock("orders").unwrap().left("ab"),
            "coord:lock:{orders}:left:ab"
        );
        assert_eq!(k.lease("w7").left("ab"), "coord:lease:{w7}:left:ab");
        assert_eq!(k.limiter("api", "log").unwrap(), "coord:limiter:{api}:log");
        assert_eq!(k.lock("}{").unwrap().claim(), "coord:lock:{%7D%7B}");
        assert_eq!(k.fence("%7D"), "coord:fence:{%257D}");
        assert_ne!(k.fence("%7D"), k.fence("}"));
        assert_eq!(k.fence("db"), "coord:fence:{db}");
        assert_eq!(k.channel(), "coord:wake");
        let sem = k.semaphore("pool");
        assert_eq!(sem[0], "coord:semaphore:{pool}");
        assert_eq!(sem[5], "coord:semaphore:{pool}:queue-permits");
        let q = k.queue("a{b}:c");
        assert_eq!(q.len(), 22);
        assert_eq!(q[0], "coord:queue:{a%7Bb%7D:c}");
        assert_eq!(q[4], "coord:queue:{a%7Bb%7D:c}:main:meta");
        assert_eq!(q[21], "coord:queue:{a%7Bb%7D:c}:dead:ordered");
        for key in &q {
            assert!(key.starts_with("coord:queue:{a%7Bb%7D:c}"), "{key}");
        }
        let unique: std::collections::HashSet<&String> = q.iter().collect();
        assert_eq!(unique.len(), 22);
    }

    #[test]
    fn php_layout_uses_the_php_class_keys() {
        let k = Keys {
            prefix: "coord:".into(),
            layout: Layout::Php,
        };
        let ClaimKeys::Php([lock, _, counter]) = k.lock("order_process_7").unwrap() else {
            panic!("the PHP layout keeps the PHP original's keys")
        };
        assert_eq!(lock, "order_process_7");
        assert_eq!(counter, "fencing_token_order_process_7");
        assert_eq!(
            k.lock("order_process_7").unwrap().left("ab"),
            "coord:lock:{order_process_7}:left:ab"
        );
        assert_eq!(k.fence("order_process_7"), counter);
        assert_eq!(k.limiter("api:user1", "log").unwrap(), "api:user1");
        assert!(k.lock("fencing_token_x").is_err());
        assert!(k.limiter("coord:lock:{x}", "log").is_err());
        assert!(k.lock("coord:semaphore:{x}").is_err());
        assert!(k.lock("coord:queue:{x}").is_err());
        assert!(k.lock("coord:locks").is_ok());
        assert_eq!(
            k.limiter("api:user1", "gcra").unwrap(),
            "coord:limiter:{api:user1}:gcra"
        );
    }
}
