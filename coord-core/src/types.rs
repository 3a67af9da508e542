//! Plain data types shared by every backend.

use std::fmt;
use std::time::Duration;

/// A fencing token: a number that strictly increases over the grants of one
/// lock name, the terms of one election and the values of one
/// [`FencingSource`](crate::FencingSource) resource.
///
/// Hand it to every resource you write to while holding the claim, and let
/// the resource reject writes whose token is lower than the highest it has
/// seen (see [`FencedRegister`](crate::FencedRegister)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A 128-bit secret that identifies one grant of a claim (or one barrier
/// arrival).
///
/// Release, extend and renew compare it on the server, so only the holder
/// can act on its claim. Its first 8 bytes are a stamp of the process that
/// made it (unique and rising within the process, see
/// [`OwnerToken::random`]); its last 8 are drawn from `rand`'s thread-local
/// CSPRNG, which is seeded from the operating system's RNG (unless a
/// simulator seeded the thread: [`crate::rng::seed_thread`]). Its `Debug`
/// output is redacted so it never reaches logs; use
/// [`OwnerToken::to_hex`] to store it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken([u8; 16]);

impl OwnerToken {
    /// A fresh, unguessable token: a stamp of this process
    /// ([`late::stamp`](crate::late::stamp): µs since the Unix epoch,
    /// strictly rising within the process) in its first 8 bytes,
    /// big-endian, then 8 random bytes. So tokens are unique, and the
    /// tokens one process makes are ordered by when they were made: a store
    /// can tell a participant's older arrival from its newer one
    /// ([`OwnerToken::stamp`]).
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        let stamp = u64::try_from(crate::stamp::stamp()).unwrap_or(0);
        bytes[..8].copy_from_slice(&stamp.to_be_bytes());
        crate::rng::fill_bytes(&mut bytes[8..]);
        OwnerToken(bytes)
    }

    /// The stamp a token from [`OwnerToken::random`] carries (its first 8
    /// bytes, big-endian): when it was made, in µs since the Unix epoch on
    /// its process's clock.
    pub fn stamp(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(b)
    }

    /// Rebuild a token from its bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        OwnerToken(bytes)
    }

    /// The 16 raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The token as 32 lowercase hex digits (the PHP original's `bin2hex(random_bytes(16))`).
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
            s.push(char::from_digit((b & 0xf) as u32, 16).unwrap_or('0'));
        }
        s
    }

    /// Parse 32 hex digits back into a token.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, chunk) in hex.as_bytes().chunks(2).enumerate() {
            let hi = (chunk[0] as char).to_digit(16)?;
            let lo = (chunk[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(OwnerToken(out))
    }

    /// A step of this owner made now: the owner, a fresh
    /// [`stamp`](crate::late::stamp), and no mark (see [`Step`]). What a
    /// caller of the backend traits sends when it keeps no book of
    /// unanswered steps; core's handles send steps from
    /// [`late::Stepped`](crate::late::Stepped), which does.
    pub fn step(&self) -> Step {
        Step {
            owner: *self,
            stamp: crate::stamp::stamp(),
            mark: false,
        }
    }
}

/// The identity of one request of an owner to the store: every mutating
/// call of the claim traits ([`Lock`](crate::Lock), [`Lease`](crate::Lease),
/// [`Election`](crate::Election), [`Semaphore`](crate::Semaphore)) carries
/// one, so a store can tell a late copy of an earlier request of the same
/// owner from the owner's newest one (see [`late`](crate::late)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Whose request it is: what the store compares to the holder.
    pub owner: OwnerToken,
    /// When it was made: stamps of one process rise strictly, so an
    /// owner's requests are ordered by when they were made, whichever
    /// connection carries them.
    pub stamp: i64,
    /// Whether the request must leave its stamp on the store as the
    /// owner's mark (a release, an extend): an earlier request of the owner
    /// went unanswered, and its late copy must be refused. Attempts ignore
    /// it.
    pub mark: bool,
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OwnerToken(<redacted>)")
    }
}

/// How far a backend's fencing tokens can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencingDurability {
    /// Tokens rise only while the process lives (the in-memory backend).
    Process,
    /// Tokens are stored durably and keep rising across server restarts
    /// (PostgreSQL rows, etcd revisions). On PostgreSQL also across a
    /// failover to a streaming standby that missed the newest WAL: each
    /// timeline (a promotion starts one) issues tokens above every earlier
    /// timeline's.
    Durable,
    /// Tokens are issued as max(stored + 1, server clock in µs), so they
    /// keep rising across data loss of any kind (a restart without
    /// persistence, a restore of an older snapshot, a lost second of an
    /// `everysec` AOF, a failover to a replica that missed writes) as long
    /// as the server clock does not go backwards and a name gets fewer than
    /// one token per microsecond (Redis).
    ClockSeeded,
    /// Tokens rise only while the deployment's own assumptions hold, and
    /// may repeat after a fault outside them: Redlock over independent
    /// Redis masters, where a token is the highest of a quorum's
    /// clock-seeded tokens and rises while the masters keep their data
    /// and their clocks differ by less than the TTL. Fence against a store
    /// with [`Durable`](Self::Durable) tokens when a repeat would do harm.
    BestEffort,
}

/// The kind of deployment a client reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Deployment {
    /// In the process (the memory store).
    Embedded,
    /// One server.
    Single,
    /// PostgreSQL with several hosts in the URL: a primary and its
    /// standbys; the client follows a failover.
    PrimaryStandby,
    /// Redis Cluster.
    Cluster,
    /// The master a Redis Sentinel names.
    Sentinel,
    /// Redlock over independent Redis masters.
    Redlock,
    /// etcd, one node or a cluster (raft).
    Raft,
}

impl Deployment {
    /// The deployment's name, as the CLI and docs write it (`"single"`,
    /// `"primary-standby"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Deployment::Embedded => "embedded",
            Deployment::Single => "single",
            Deployment::PrimaryStandby => "primary-standby",
            Deployment::Cluster => "cluster",
            Deployment::Sentinel => "sentinel",
            Deployment::Redlock => "redlock",
            Deployment::Raft => "raft",
        }
    }
}

impl std::fmt::Display for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a backend promises, so the conformance suite and users can tell
/// backends apart. Backends start from [`Capabilities::new`] and set the
/// fields they promise; more fields may come, so it is not built as a
/// literal outside coord-core.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Backend name, as in URLs and errors (`"memory"`, `"redis"`, ...).
    pub backend: &'static str,
    /// The smallest TTL the backend accepts.
    pub min_ttl: Duration,
    /// TTLs are rounded UP to a multiple of this.
    pub ttl_granularity: Duration,
    /// Waiters are granted in arrival order across all clients.
    pub fair: bool,
    /// How durable fencing tokens are.
    pub fencing: FencingDurability,
    /// Expiry and limiter windows are measured on the server's clock (true)
    /// or on each client's clock (false).
    pub server_clock: bool,
    /// Waiters are woken by notifications from the store (false: polling only).
    pub notifications: bool,
    /// The kind of deployment this client reaches.
    pub deployment: Deployment,
    /// An acknowledged grant stays exclusive when the store machine that
    /// granted it is lost and another takes over (true where a grant is
    /// on a majority or a synchronous standby before it is acknowledged:
    /// etcd's raft). False where replication is asynchronous (Redis
    /// replicas, Redis Cluster): the new primary may never have seen a
    /// grant, so a second client can be granted the same name while the
    /// first still holds it, until the first's TTL runs out. Fencing tokens
    /// still rise (see [`FencingDurability`]), so a resource that checks
    /// them refuses the older holder's writes; fence every write where this
    /// is false.
    pub exclusive_across_failover: bool,
    /// How long after its TTL a claim the holder stopped renewing may
    /// still be held on the store, keeping others waiting (never longer
    /// valid for its holder: a guard's validity is counted on the
    /// holder's clock). Zero where the store expires a claim at its TTL;
    /// etcd revokes expired leases in a periodic sweep through raft, up to
    /// about 1.5 s late.
    pub expiry_lag: Duration,
    /// The primitives this deployment cannot offer, each with why and what
    /// to use instead: `(primitive, reason)`, the primitive named as in
    /// [`Error::Unsupported`](crate::Error::Unsupported) (`"locks"`,
    /// `"leases"`, `"fencing tokens"`, `"elections"`, `"barriers"`,
    /// `"rate limiters"`, `"semaphores"`, `"read-write locks"`,
    /// `"queues"`, `"inspect"`, `"holder metadata"`). Empty where a
    /// backend offers everything (or does not say).
    pub unsupported: &'static [(&'static str, &'static str)],
}

impl Capabilities {
    /// Capabilities of a backend named `backend` with 1 ms TTL resolution and
    /// no other promises; adjust the fields from there.
    pub fn new(backend: &'static str) -> Self {
        Capabilities {
            backend,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            fair: false,
            fencing: FencingDurability::Process,
            server_clock: false,
            notifications: false,
            deployment: Deployment::Single,
            exclusive_across_failover: false,
            expiry_lag: Duration::ZERO,
            unsupported: &[],
        }
    }

    /// Why this deployment does not offer `primitive`
    /// ([`Capabilities::unsupported`]), or `""` when it does not say.
    ///
    /// ```
    /// let mut caps = coord_core::Capabilities::new("demo");
    /// caps.unsupported = &[("barriers", "use etcd")];
    /// assert_eq!(caps.why_unsupported("barriers"), "use etcd");
    /// assert_eq!(caps.why_unsupported("locks"), "");
    /// ```
    pub fn why_unsupported(&self, primitive: &str) -> &'static str {
        self.unsupported
            .iter()
            .find(|(p, _)| *p == primitive)
            .map_or("", |(_, why)| why)
    }
}

/// A rate limiting algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Exact: every admitted request is logged with its time (each with its
    /// own unique member) and counted over the trailing window. Memory grows
    /// with the limit.
    SlidingLog,
    /// Approximate, O(1) memory: the current fixed window's count plus the
    /// previous window's count weighted by how much of it still overlaps the
    /// trailing window.
    SlidingWindow,
    /// O(1): a counter per aligned window; allows up to 2x limit across a
    /// window boundary.
    FixedWindow,
    /// Generic cell rate algorithm (a token bucket): `limit` requests per
    /// `window` at a steady rate, with bursts of up to `limit`.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, for tests and tours.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Gcra,
    ];
}

/// How many requests (by cost) are admitted per window, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// Requests (total cost) admitted per window; at least 1.
    pub limit: u64,
    /// The window; greater than zero.
    pub window: Duration,
    /// The algorithm.
    pub algorithm: Algorithm,
}

impl Quota {
    /// `limit` per `window` with `algorithm`. Checked when used.
    pub fn new(limit: u64, window: Duration, algorithm: Algorithm) -> Self {
        Quota {
            limit,
            window,
            algorithm,
        }
    }

    /// `limit` per `window`, exact sliding log (the PHP original's algorithm).
    pub fn per(limit: u64, window: Duration) -> Self {
        Quota::new(limit, window, Algorithm::SlidingLog)
    }

    /// The same quota with another algorithm.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }
}

/// The answer of a rate limiter check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request was admitted (and recorded).
    pub allowed: bool,
    /// How much cost could still be admitted now.
    pub remaining: u64,
    /// When denied: how long until the same request could be admitted
    /// (always > 0). Zero when allowed.
    pub retry_after: Duration,
    /// How long until the full quota is available again.
    pub reset_after: Duration,
}

/// The current leader of an election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderInfo {
    /// The candidate's identity, as it campaigned.
    pub candidate: String,
    /// The term: a fencing token that strictly increases over the terms of
    /// one election.
    pub term: FencingToken,
}

/// Where an arrival at a barrier stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    /// The generation this participant joined.
    pub generation: u64,
    /// Whether that generation is already complete (this was the last arrival,
    /// or the participant had already arrived in a generation that completed).
    pub complete: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_token_hex_roundtrip_and_redacted_debug() {
        let t = OwnerToken::random();
        let hex = t.to_hex();
        assert_eq!(hex.len(), 32);
        assert_eq!(OwnerToken::from_hex(&hex), Some(t));
        assert_eq!(OwnerToken::from_hex("zz"), None);
        assert!(!format!("{t:?}").contains(&hex));
        assert_ne!(OwnerToken::random(), t);
    }

    /// Beside the stamp, a token carries 8 random bytes: two processes
    /// stamping the same µs still make different tokens.
    #[test]
    fn owner_tokens_carry_random_bytes_beside_their_stamp() {
        let (a, b) = (OwnerToken::random(), OwnerToken::random());
        assert_ne!(a.as_bytes()[8..], b.as_bytes()[8..]);
        assert_ne!(a.as_bytes()[8..], [0u8; 8]);
    }

    #[test]
    fn owner_token_bytes_roundtrip() {
        let t = OwnerToken::random();
        assert_eq!(OwnerToken::from_bytes(*t.as_bytes()), t);
        let known = OwnerToken::from_bytes([0xab; 16]);
        assert_eq!(known.as_bytes(), &[0xab; 16]);
        assert_eq!(known.to_hex(), "ab".repeat(16));
    }
}
