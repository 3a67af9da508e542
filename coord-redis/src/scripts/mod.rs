//! The Lua scripts. Each is one atomic server step, loaded once at connect
//! time (`SCRIPT LOAD`) and called by `EVALSHA`; after a `SCRIPT FLUSH` or a
//! server restart the `NOSCRIPT` reply makes `redis::Script` load it again
//! and retry.
//!
//! Names, owner tokens and candidates reach the scripts only as `KEYS` and
//! `ARGV`, never spliced into the script text. Numbers that must stay exact
//! (fencing tokens, clock seeds) travel as strings: a Lua number turned into
//! a string by Redis may lose digits on some versions.

mod claim;

use claim::{
    ACQUIRE, ACQUIRE_FREE, ACQUIRE_FREE_META, CAMPAIGN, ELECTION_INSPECT, ELECTION_RENEW, EXTEND,
    FENCE_NEXT, FORCE_RELEASE, FREE, HELD_BY, INSPECT, PHP_ACQUIRE, PHP_ACQUIRE_META,
    PHP_ACQUIRE_REST, PHP_EXTEND, PHP_FORCE_RELEASE, PHP_INSPECT, PHP_RELEASE, RAISE, RELEASE,
    REMAINING, RESIGN,
};
use redis::Script;

/// Issue the next fencing token from the counter in a key: max(stored + 1,
/// server time in µs). The counter may come back OLDER than tokens already
/// issued (a restart from an older RDB snapshot, a lost `everysec` AOF
/// tail, a failover to a lagging replica, the PHP's `INCR` on a
/// missing key); the clock term keeps tokens above every token issued
/// before, as long as the server clock does not go back and fewer than one
/// token per µs is issued per counter. Exact: `INCR` does the `+ 1` on a
/// 64-bit integer and the comparison is on decimal strings (neither has
/// leading zeros, so the longer is larger, and equal lengths compare as
/// text); no value passes through a Lua number. Returns the token as a
/// string.
const ISSUE: &str = r#"
local function issue(counter)
  local t = redis.call('TIME')
  local now = t[1] .. string.rep('0', 6 - string.len(t[2])) .. t[2]
  local nxt = now
  if redis.call('EXISTS', counter) == 1 then
    redis.call('INCR', counter)
    local inc = redis.call('GET', counter)
    if string.len(inc) > string.len(now)
      or (string.len(inc) == string.len(now) and inc > now) then
      return inc
    end
  end
  redis.call('SET', counter, nxt)
  return nxt
end
"#;

/// The server time in µs as a decimal string, `now`.
const NOW: &str = r#"
local t = redis.call('TIME')
local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
"#;

/// The refusal of a late copy of an attempt (`coord_core::late`): the
/// attempt's owner left a mark in `KEYS[key]` (the release's stamp, written
/// when the owner released while one of its attempts went unanswered) and
/// this attempt is stamped (`ARGV[stamp]`) before it. Refused, it changes
/// nothing and says the claim is held (its PTTL: -2 when free). One key
/// lookup (a miss, nearly always) per attempt. Stamps are µs since the Unix
/// epoch, exact in a Lua number (below 2^53) until the year 2255.
fn late(key: usize, stamp: usize) -> String {
    format!(
        "local gone = redis.call('GET', KEYS[{key}])\n\
         if gone and tonumber(ARGV[{stamp}]) < tonumber(gone) then\n\
         \x20 return {{0, redis.call('PTTL', KEYS[1])}}\n\
         end\n"
    )
}

/// A release's mark against late copies of its owner's attempts (see
/// [`late`]): when the release names the mark's key (`KEYS[key]`, only
/// passed by the release of an owner with an unanswered attempt), the
/// release's stamp (`ARGV[stamp]`) is kept there for `ARGV[stamp + 1]` ms,
/// whether or not the owner holds the claim, unless a later step of the
/// owner left a higher one. A release after answered attempts (nearly all)
/// names no such key and costs nothing more.
fn mark(key: usize, stamp: usize) -> String {
    let ttl = stamp + 1;
    format!(
        "if KEYS[{key}] then\n\
         \x20 local was = redis.call('GET', KEYS[{key}])\n\
         \x20 if not was or tonumber(ARGV[{stamp}]) > tonumber(was) then\n\
         \x20   redis.call('SET', KEYS[{key}], ARGV[{stamp}], 'PX', ARGV[{ttl}])\n\
         \x20 end\n\
         end\n"
    )
}

/// The start of an owner's extend or renewal (`coord_core::late`): it
/// always names the owner's mark (`KEYS[key]`) and carries its stamp
/// (`ARGV[stamp]`). Stamped before the mark, it is a late copy overtaken by
/// a later step of its owner: it returns -1 and changes nothing (it would
/// set the expiry back to its own TTL). With a mark lifetime after the
/// stamp (`ARGV[stamp + 1]`, sent when an earlier step of the owner went
/// unanswered), it leaves its own stamp as the mark first, as a release
/// does (see [`mark`]).
fn step(key: usize, stamp: usize) -> String {
    let ttl = stamp + 1;
    format!(
        "local gone = redis.call('GET', KEYS[{key}])\n\
         if gone and tonumber(ARGV[{stamp}]) < tonumber(gone) then return -1 end\n\
         if ARGV[{ttl}] then\n\
         \x20 redis.call('SET', KEYS[{key}], ARGV[{stamp}], 'PX', ARGV[{ttl}])\n\
         end\n"
    )
}

/// `later(a, b)`: whether decimal string `a` is above `b` (no leading
/// zeros: the longer is larger, equal lengths compare as text); the
/// successor of a decimal string, exactly (no Lua number involved); and
/// the next fencing token after `prev` (a decimal string, or nil when
/// nothing is stored): max(prev + 1, now). Needs [`NOW`]. (Defined where
/// needed, after any fast path: creating closures costs every call.)
const NEXT_TOKEN: &str = r#"
local function later(a, b)
  return #a > #b or (#a == #b and a > b)
end
local function succ(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1)
    .. string.rep('0', #s - i)
end
local function next_token(prev)
  if prev then
    local inc = succ(prev)
    if later(inc, now) then return inc end
  end
  return now
end
"#;

/// Arrive at a barrier (see the file).
const ARRIVE: &str = include_str!("../lua/barrier_arrive.lua");

/// Whether a barrier generation completed (see the file).
const IS_COMPLETE: &str = include_str!("../lua/barrier_is_complete.lua");

/// Withdraw from a barrier generation (see the file).
const WITHDRAW: &str = include_str!("../lua/barrier_withdraw.lua");

/// The limiters' shared prelude: the server clock (`TIME`), the quota
/// (`ARGV[1..3]`: limit, window µs, cost) and exact integer helpers. All
/// limiter scripts return `{allowed, remaining, retry_after µs,
/// reset_after µs}`.
const LIMITER_PRELUDE: &str = include_str!("../lua/limiter_prelude.lua");

/// Sliding log, one member per request carrying its cost (see the file).
const SLIDING_LOG: &str = include_str!("../lua/sliding_log.lua");

/// Sliding-window counter (see the file).
const SLIDING_WINDOW: &str = include_str!("../lua/sliding_window.lua");

/// Fixed window (see the file).
const FIXED_WINDOW: &str = include_str!("../lua/fixed_window.lua");

/// GCRA with an exact TAT (see the file).
const GCRA: &str = include_str!("../lua/gcra.lua");

/// What every semaphore script shares: its keys, pruning, wake-ups and
/// expiry (see the file).
const SEMAPHORE_PRELUDE: &str = include_str!("../lua/semaphore_prelude.lua");

/// One semaphore attempt, FIFO (see the file).
const SEMAPHORE_ACQUIRE: &str = include_str!("../lua/semaphore_acquire.lua");

/// Owner-checked semaphore release (see the file).
const SEMAPHORE_RELEASE: &str = include_str!("../lua/semaphore_release.lua");

/// Owner-checked semaphore extend (see the file).
const SEMAPHORE_EXTEND: &str = include_str!("../lua/semaphore_extend.lua");

/// Remove every grant of a semaphore (see the file).
const SEMAPHORE_FORCE_RELEASE: &str = include_str!("../lua/semaphore_force_release.lua");

/// Every live grant of a semaphore and how many wait (see the file).
const SEMAPHORE_INSPECT: &str = include_str!("../lua/semaphore_inspect.lua");

/// What every queue script shares: its keys, the delivery index and its
/// upkeep, wake-ups and the cleanup of an idle queue (see the file).
const QUEUE_PRELUDE: &str = include_str!("../lua/queue_prelude.lua");

/// Push a message, deduplicated (see the file).
const QUEUE_PUSH: &str = include_str!("../lua/queue_push.lua");

/// One delivery attempt (see the file).
const QUEUE_POP: &str = include_str!("../lua/queue_pop.lua");

/// Owner-checked ack (see the file).
const QUEUE_ACK: &str = include_str!("../lua/queue_ack.lua");

/// Owner-checked nack (see the file).
const QUEUE_NACK: &str = include_str!("../lua/queue_nack.lua");
/// Abandoning a consumer whose pop attempts no caller saw (see the file).
const QUEUE_ABANDON: &str = include_str!("../lua/queue_abandon.lua");

/// Owner-checked extend of a delivery (see the file).
const QUEUE_EXTEND: &str = include_str!("../lua/queue_extend.lua");

/// Read a lane's first messages (see the file).
const QUEUE_PEEK: &str = include_str!("../lua/queue_peek.lua");

/// Move dead letters back to the main lane (see the file).
const QUEUE_REDRIVE: &str = include_str!("../lua/queue_redrive.lua");

/// Count a queue's messages (see the file).
const QUEUE_STATS: &str = include_str!("../lua/queue_stats.lua");

/// Delete a queue's messages and dedup ids (see the file).
const QUEUE_PURGE: &str = include_str!("../lua/queue_purge.lua");

/// Every script of the backend, compiled once per client.
pub(crate) struct Scripts {
    pub acquire: Script,
    pub release: Script,
    pub extend: Script,
    pub force_release: Script,
    pub raise: Script,
    pub remaining: Script,
    pub acquire_meta: Script,
    pub inspect: Script,
    pub php_acquire: Script,
    pub php_acquire_meta: Script,
    pub php_inspect: Script,
    pub php_release: Script,
    pub php_extend: Script,
    pub php_force_release: Script,
    pub fence_next: Script,
    pub campaign: Script,
    pub election_renew: Script,
    pub resign: Script,
    pub election_inspect: Script,
    pub arrive: Script,
    pub withdraw: Script,
    pub is_complete: Script,
    pub sliding_log: Script,
    pub sliding_window: Script,
    pub fixed_window: Script,
    pub gcra: Script,
    pub semaphore_acquire: Script,
    pub semaphore_release: Script,
    pub semaphore_extend: Script,
    pub semaphore_force_release: Script,
    pub semaphore_inspect: Script,
    pub queue_push: Script,
    pub queue_pop: Script,
    pub queue_ack: Script,
    pub queue_nack: Script,
    /// Abandon a consumer's pop attempts.
    pub queue_abandon: Script,
    pub queue_extend: Script,
    pub queue_peek: Script,
    pub queue_redrive: Script,
    pub queue_stats: Script,
    pub queue_purge: Script,
    /// The source of each, for `SCRIPT LOAD` at connect time.
    pub sources: Vec<String>,
    /// The source of each by its SHA1, for `EVAL` where `EVALSHA` finds
    /// the script not cached (see `RedisBackend::eval`).
    by_hash: std::collections::HashMap<String, usize>,
}

impl Scripts {
    pub fn new() -> Self {
        let mut sources = Vec::new();
        let (late_claim, late_php, late_campaign) = (late(2, 4), late(4, 3), late(2, 6));
        let (mark_claim, mark_php) = (mark(2, 4), mark(3, 4));
        // An extend (or renewal) is refused when stamped before its
        // owner's mark, and marks as a release does when a step of its
        // owner went unanswered: that step's late copy, stamped before,
        // would otherwise set the claim's expiry back to its own TTL.
        let (step_extend, step_php_extend) = (step(2, 3), step(3, 3));
        let mut by_hash = std::collections::HashMap::new();
        let mut mk = |parts: &[&str]| {
            let src = parts.concat();
            let script = Script::new(&src);
            by_hash.insert(script.get_hash().to_string(), sources.len());
            sources.push(src);
            script
        };
        Scripts {
            acquire: mk(&[&late_claim, NOW, ACQUIRE_FREE, NEXT_TOKEN, ACQUIRE]),
            release: mk(&[HELD_BY, FREE, &mark_claim, RELEASE]),
            extend: mk(&[&step_extend, HELD_BY, EXTEND]),
            force_release: mk(&[FREE, FORCE_RELEASE]),
            raise: mk(&[RAISE]),
            remaining: mk(&[REMAINING]),
            acquire_meta: mk(&[&late_claim, NOW, ACQUIRE_FREE_META, NEXT_TOKEN, ACQUIRE]),
            inspect: mk(&[INSPECT]),
            php_acquire: mk(&[&late_php, ISSUE, PHP_ACQUIRE, PHP_ACQUIRE_REST]),
            php_acquire_meta: mk(&[&late_php, ISSUE, PHP_ACQUIRE_META, PHP_ACQUIRE_REST]),
            php_inspect: mk(&[PHP_INSPECT]),
            php_release: mk(&[&mark_php, PHP_RELEASE]),
            php_extend: mk(&[&step_php_extend, PHP_EXTEND]),
            php_force_release: mk(&[PHP_FORCE_RELEASE]),
            fence_next: mk(&[ISSUE, NOW, NEXT_TOKEN, FENCE_NEXT]),
            campaign: mk(&[&late_campaign, NOW, NEXT_TOKEN, CAMPAIGN]),
            election_renew: mk(&[&step_extend, ELECTION_RENEW]),
            resign: mk(&[&mark_claim, RESIGN]),
            election_inspect: mk(&[ELECTION_INSPECT]),
            arrive: mk(&[ARRIVE]),
            withdraw: mk(&[WITHDRAW]),
            is_complete: mk(&[IS_COMPLETE]),
            sliding_log: mk(&[LIMITER_PRELUDE, SLIDING_LOG]),
            sliding_window: mk(&[LIMITER_PRELUDE, SLIDING_WINDOW]),
            fixed_window: mk(&[LIMITER_PRELUDE, FIXED_WINDOW]),
            gcra: mk(&[LIMITER_PRELUDE, GCRA]),
            semaphore_acquire: mk(&[NOW, NEXT_TOKEN, SEMAPHORE_PRELUDE, SEMAPHORE_ACQUIRE]),
            semaphore_release: mk(&[NOW, NEXT_TOKEN, SEMAPHORE_PRELUDE, SEMAPHORE_RELEASE]),
            semaphore_extend: mk(&[NOW, NEXT_TOKEN, SEMAPHORE_PRELUDE, SEMAPHORE_EXTEND]),
            semaphore_force_release: mk(&[
                NOW,
                NEXT_TOKEN,
                SEMAPHORE_PRELUDE,
                SEMAPHORE_FORCE_RELEASE,
            ]),
            semaphore_inspect: mk(&[NOW, NEXT_TOKEN, SEMAPHORE_PRELUDE, SEMAPHORE_INSPECT]),
            queue_push: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_PUSH]),
            queue_pop: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_POP]),
            queue_ack: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_ACK]),
            queue_nack: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_NACK]),
            queue_abandon: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_ABANDON]),
            queue_extend: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_EXTEND]),
            queue_peek: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_PEEK]),
            queue_redrive: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_REDRIVE]),
            queue_stats: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_STATS]),
            queue_purge: mk(&[NOW, NEXT_TOKEN, QUEUE_PRELUDE, QUEUE_PURGE]),
            sources,
            by_hash,
        }
    }

    /// The source of the script whose SHA1 is `hash`.
    pub fn source_of(&self, hash: &str) -> Option<&str> {
        self.by_hash.get(hash).map(|&i| self.sources[i].as_str())
    }
}
