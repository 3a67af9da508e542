//! The Lua scripts. Each is one atomic server step, loaded once at connect
//! time (`SCRIPT LOAD`) and called by `EVALSHA`; after a `SCRIPT FLUSH` or a
//! server restart the `NOSCRIPT` reply makes `redis::Script` load it again
//! and retry.
//!
//! Names, owner tokens and candidates reach the scripts only as `KEYS` and
//! `ARGV`, never spliced into the script text. Numbers that must stay exact
//! (fencing tokens, clock seeds) travel as strings: a Lua number turned into
//! a string by Redis may lose digits on some versions.

use redis::Script;

/// Issue the next fencing token from the counter in a key: max(stored + 1,
/// server time in µs). The counter may come back OLDER than tokens already
/// issued (a restart from an older RDB snapshot, a lost `everysec` AOF
/// tail, a failover to a lagging replica, the seed PHP's `INCR` on a
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

/// Acquire a claim (lock or lease).
/// KEYS: claim (value = owner token), grant (value = this grant's fencing
/// token, same TTL), counter. ARGV: owner, ttl ms.
/// Returns `{1, token}` when granted (or already held by this owner: the
/// same token, TTL refreshed), `{0, pttl}` when held by another.
const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local tok = issue(KEYS[3])
  redis.call('SET', KEYS[2], tok, 'PX', ARGV[2])
  return {1, tok}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local tok = redis.call('GET', KEYS[2])
  if not tok then tok = issue(KEYS[3]) end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('SET', KEYS[2], tok, 'PX', ARGV[2])
  return {1, tok}
end
return {0, redis.call('PTTL', KEYS[1])}
"#;

/// Compare-and-delete, then publish a wake-up.
/// KEYS: claim, grant. ARGV: owner, channel ('' = none), payload.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  if ARGV[2] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
  return 1
end
return 0
"#;

/// Compare-and-PEXPIRE. Never resurrects (a missing key does not match).
/// KEYS: claim, grant. ARGV: owner, ttl ms.
const EXTEND: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
"#;

/// Delete whoever holds it, then publish a wake-up.
/// KEYS: claim, grant. ARGV: channel, payload. Returns 1 if a claim existed.
const FORCE_RELEASE: &str = r#"
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
"#;

/// The next token of a fencing source. KEYS: counter.
const FENCE_NEXT: &str = r#"
return issue(KEYS[1])
"#;

/// Campaign. KEYS: election hash (owner, candidate, term), term counter.
/// ARGV: owner, ttl ms, candidate, channel, payload.
const CAMPAIGN: &str = r#"
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('HGET', KEYS[1], 'term')}
end
if cur then
  return {0, redis.call('PTTL', KEYS[1])}
end
local term = issue(KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'candidate', ARGV[3], 'term', term)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return {1, term}
"#;

/// Renew leadership. KEYS: election hash. ARGV: owner, ttl ms.
const ELECTION_RENEW: &str = r#"
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// Resign. KEYS: election hash. ARGV: owner, channel, payload.
const RESIGN: &str = r#"
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"#;

/// Arrive at a barrier. KEYS: state hash (gen, parties, last), members of
/// the open generation (set), their arrival ids (hash participant -> id),
/// the arrival ids of the generation that completed last (set).
/// ARGV: parties, participant, channel, payload, arrival id.
/// An arrival id of the last completed generation (a retry whose reply was
/// lost) returns that generation as complete and changes nothing.
/// Arriving again in the open generation counts once; after the generation
/// completed, the same participant's next arrival (a new id) joins the next
/// one (reusable barrier, as the reference backend does).
/// Returns `{generation, complete}`, or `{-1, parties}` when the open
/// generation was started with another party count.
const ARRIVE: &str = r#"
if redis.call('SISMEMBER', KEYS[4], ARGV[5]) == 1 then
  return {tonumber(redis.call('HGET', KEYS[1], 'last')), 1}
end
local gen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
local n = redis.call('SCARD', KEYS[2])
if n > 0 then
  local p = redis.call('HGET', KEYS[1], 'parties')
  if p and p ~= ARGV[1] then
    return {-1, tonumber(p)}
  end
end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 1 then
  return {gen, 0}
end
redis.call('HSET', KEYS[1], 'parties', ARGV[1], 'gen', tostring(gen))
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[5])
if n + 1 >= tonumber(ARGV[1]) then
  local ids = redis.call('HVALS', KEYS[3])
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  for _, id in ipairs(ids) do redis.call('SADD', KEYS[4], id) end
  redis.call('HSET', KEYS[1], 'gen', tostring(gen + 1), 'last', tostring(gen))
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return {gen, 1}
end
return {gen, 0}
"#;

/// Withdraw from a barrier generation. KEYS: as [`ARRIVE`].
/// ARGV: generation, participant. Returns 0 if that generation completed.
const WITHDRAW: &str = r#"
local cur = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
local gen = tonumber(ARGV[1])
if gen < cur then return 0 end
if gen == cur then
  redis.call('SREM', KEYS[2], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
end
return 1
"#;

/// The limiters' shared prelude: the server clock (`TIME`), the quota
/// (`ARGV[1..3]`: limit, window µs, cost) and exact integer helpers. All
/// limiter scripts return `{allowed, remaining, retry_after µs,
/// reset_after µs}`.
const LIMITER_PRELUDE: &str = include_str!("lua/limiter_prelude.lua");

/// Sliding log, one member per request carrying its cost (see the file).
const SLIDING_LOG: &str = include_str!("lua/sliding_log.lua");

/// Sliding-window counter (see the file).
const SLIDING_WINDOW: &str = include_str!("lua/sliding_window.lua");

/// Fixed window (see the file).
const FIXED_WINDOW: &str = include_str!("lua/fixed_window.lua");

/// GCRA with an exact TAT (see the file).
const GCRA: &str = include_str!("lua/gcra.lua");

/// Every script of the backend, compiled once per client.
pub(crate) struct Scripts {
    pub acquire: Script,
    pub release: Script,
    pub extend: Script,
    pub force_release: Script,
    pub fence_next: Script,
    pub campaign: Script,
    pub election_renew: Script,
    pub resign: Script,
    pub arrive: Script,
    pub withdraw: Script,
    pub sliding_log: Script,
    pub sliding_window: Script,
    pub fixed_window: Script,
    pub gcra: Script,
    /// The source of each, for `SCRIPT LOAD` at connect time.
    pub sources: Vec<String>,
}

impl Scripts {
    pub fn new() -> Self {
        let mut sources = Vec::new();
        let mut mk = |parts: &[&str]| {
            let src = parts.concat();
            let script = Script::new(&src);
            sources.push(src);
            script
        };
        Scripts {
            acquire: mk(&[ISSUE, ACQUIRE]),
            release: mk(&[RELEASE]),
            extend: mk(&[EXTEND]),
            force_release: mk(&[FORCE_RELEASE]),
            fence_next: mk(&[ISSUE, FENCE_NEXT]),
            campaign: mk(&[ISSUE, CAMPAIGN]),
            election_renew: mk(&[ELECTION_RENEW]),
            resign: mk(&[RESIGN]),
            arrive: mk(&[ARRIVE]),
            withdraw: mk(&[WITHDRAW]),
            sliding_log: mk(&[LIMITER_PRELUDE, SLIDING_LOG]),
            sliding_window: mk(&[LIMITER_PRELUDE, SLIDING_WINDOW]),
            fixed_window: mk(&[LIMITER_PRELUDE, FIXED_WINDOW]),
            gcra: mk(&[LIMITER_PRELUDE, GCRA]),
            sources,
        }
    }
}
