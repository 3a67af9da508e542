//! The claim scripts: locks and leases in the default and PHP layouts,
//! fencing sources and elections (see the parent module for what they
//! share).

/// A claim (lock or lease) of the default layout is ONE key:
/// - held: `<owner>:<token>`, or `<owner>:<token>~<metadata>~` for a grant
///   made with holder metadata (stored in the claim itself, so it ends
///   exactly when the claim does: release, expiry, force release), with `*`
///   appended once somebody waits (a refused attempt from a client that has
///   local waiters on the name marks it), on the claim's TTL;
/// - released: deleted, once the server clock has passed the token (so
///   any later grant, issued at a later µs, rises above it); otherwise
///   (a release within the µs of its grant, or a token issued ahead of the
///   clock) `=<token>` on what is left of the claim's TTL (`KEEPTTL`), or
///   until the server clock passes the token if that is later, which
///   the next grant rises above. Either way the name costs nothing once
///   its TTL (and the clock) has passed its token.
///
/// Acquire. KEYS: claim, the owner's mark against late copies (see
/// [`late`](super::late), checked first). ARGV: owner, ttl ms, '1' if this client has a
/// waiter on the name, '2' if it has several (then a grant is marked too:
/// one of them may be the one granted, the others still wait), the
/// client's stamp of the attempt. Returns `{1, token}` when granted,
/// `{1, token, 1}` when already held by this owner (the same token, TTL
/// refreshed), `{0, pttl}`
/// when held by another (or refused as a late copy). A free name costs the
/// mark's `GET` (a miss) + `TIME` + `SET NX PX`, the raw lock's own
/// command; this is that fast path.
pub(super) const ACQUIRE_FREE: &str = r#"
local mark = ARGV[3] == '2' and '*' or ''
if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. now .. mark, 'NX', 'PX', ARGV[2]) then
  return {1, now}
end
local tail = ''
"#;

/// [`ACQUIRE_FREE`] for a grant with holder metadata. `ARGV[5]`: the
/// metadata, stored as `~<metadata>~` after the token (`tail`). Only a new
/// grant writes it: a retry by the holder keeps its grant as it is.
pub(super) const ACQUIRE_FREE_META: &str = r#"
local mark = ARGV[3] == '2' and '*' or ''
local tail = '~' .. ARGV[5] .. '~'
if redis.call('SET', KEYS[1], ARGV[1] .. ':' .. now .. tail .. mark, 'NX', 'PX', ARGV[2]) then
  return {1, now}
end
"#;

/// The rest of acquire, when the key exists (see [`ACQUIRE_FREE`]); a
/// new grant gets `tail` (the metadata, or nothing) after its token.
pub(super) const ACQUIRE: &str = r#"
local v = redis.call('GET', KEYS[1])
local prev = nil
if v then
  if string.byte(v, 1) == 61 then
    prev = string.sub(v, 2)
  else
    local n = #ARGV[1]
    if string.byte(v, n + 1) == 58 and string.sub(v, 1, n) == ARGV[1] then
      local tok = string.sub(v, n + 2)
      if string.byte(tok, -1) == 42 then
        tok = string.sub(tok, 1, -2)
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
      elseif mark == '*' then
        redis.call('SET', KEYS[1], v .. '*', 'PX', ARGV[2])
      else
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
      end
      if string.byte(tok, -1) == 126 then tok = string.match(tok, '^%d+') end
      return {1, tok, 1}
    end
    if ARGV[3] ~= '0' and string.byte(v, -1) ~= 42 then
      redis.call('SET', KEYS[1], v .. '*', 'KEEPTTL')
    end
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
local tok = next_token(prev)
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. tok .. tail .. mark, 'PX', ARGV[2])
return {1, tok}
"#;

/// The owner's token of a held claim value, and whether somebody waits;
/// nil when `v` is not held by `owner`. (Metadata after the token, which
/// ends with `~`, is skipped.)
pub(super) const HELD_BY: &str = r#"
local function held_by(v, owner)
  local n = #owner
  if not v or string.byte(v, n + 1) ~= 58 or string.sub(v, 1, n) ~= owner then
    return nil
  end
  local tok = string.sub(v, n + 2)
  local waited = string.byte(tok, -1) == 42
  if waited then tok = string.sub(tok, 1, -2) end
  if string.byte(tok, -1) == 126 then tok = string.match(tok, '^%d+') end
  return tok, waited
end
"#;

/// `free(key, tok)`: delete a released claim if the server clock has
/// passed its token (every later grant is then above it), else leave
/// `=<token>` for the rest of its TTL, or until the clock passes the token
/// if that is later (a token ahead of this server's clock: issued faster
/// than one per µs, or raised to a Redlock quorum's token from a master
/// whose clock is ahead), at most a day.
pub(super) const FREE: &str = r#"
local function free(key, tok)
  local t = redis.call('TIME')
  local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  if #now > #tok or (#now == #tok and now > tok) then
    redis.call('DEL', key)
  else
    local ahead = math.floor((tonumber(tok) - tonumber(now)) / 1000) + 1
    if ahead > 86400000 then ahead = 86400000 end
    if redis.call('PTTL', key) < ahead then
      redis.call('SET', key, '=' .. tok, 'PX', ahead)
    else
      redis.call('SET', key, '=' .. tok, 'KEEPTTL')
    end
  end
end
"#;

/// Redlock's second step on one master: set the token of a claim `owner`
/// holds to the quorum's token (the highest its masters issued), keeping
/// its TTL, metadata and waiting mark. A master that granted too late to
/// be counted may hold a higher token of its own; it is set to the
/// quorum's too, so every master holding the claim agrees on its token
/// (and a retry by the owner gets that token again). KEYS: claim. ARGV:
/// owner, token. Returns 1 if `owner` holds the claim, else 0 (nothing
/// changed).
pub(super) const RAISE: &str = r#"
local v = redis.call('GET', KEYS[1])
local n = #ARGV[1]
if not v or string.byte(v, n + 1) ~= 58 or string.sub(v, 1, n) ~= ARGV[1] then
  return 0
end
local rest = string.sub(v, n + 2)
local tok = string.match(rest, '^%d+')
if not tok then return 0 end
if tok ~= ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. ARGV[2] .. string.sub(rest, #tok + 1), 'KEEPTTL')
end
return 1
"#;

/// Compare-and-release (see [`FREE`]), publishing a wake-up only when
/// somebody waits. KEYS: claim [, the owner's mark (see [`mark`](super::mark))].
/// ARGV: owner, channel, payload [, stamp, mark ttl ms].
pub(super) const RELEASE: &str = r#"
local tok, waited = held_by(redis.call('GET', KEYS[1]), ARGV[1])
if not tok then return 0 end
free(KEYS[1], tok)
if waited then redis.call('PUBLISH', ARGV[2], ARGV[3]) end
return 1
"#;

/// Compare-and-PEXPIRE (after [`step`](super::step)). Never resurrects (a missing key
/// or a released marker does not match). KEYS: claim, the owner's mark.
/// ARGV: owner, ttl ms, stamp [, mark ttl ms].
pub(super) const EXTEND: &str = r#"
if not held_by(redis.call('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// Free whoever holds it, then publish a wake-up. KEYS: claim.
/// ARGV: channel, payload. Returns 1 if a claim was held.
pub(super) const FORCE_RELEASE: &str = r#"
local v = redis.call('GET', KEYS[1])
local n = 0
if v and string.byte(v, 1) ~= 61 then
  n = 1
  local i = string.find(v, ':', 1, true)
  local tok = i and string.match(string.sub(v, i + 1), '^%d+')
  if tok then free(KEYS[1], tok) else redis.call('DEL', KEYS[1]) end
end
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
"#;

/// A lease's remaining time: its PTTL, or -2 when not held (missing, or a
/// released marker). KEYS: claim.
pub(super) const REMAINING: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v, 1) == 61 then return -2 end
return redis.call('PTTL', KEYS[1])
"#;

/// Who holds a claim (read only). KEYS: claim. Returns `{}` when not held
/// (missing, or a released marker), else `{owner, token, pttl}` with the
/// metadata as a fourth item when the grant carries some; `{-1}` when the
/// key holds a value coord does not write.
pub(super) const INSPECT: &str = r#"
local v = redis.call('GET', KEYS[1])
if not v or string.byte(v, 1) == 61 then return {} end
local i = string.find(v, ':', 1, true)
if not i then return {-1} end
local rest = string.sub(v, i + 1)
if string.byte(rest, -1) == 42 then rest = string.sub(rest, 1, -2) end
local tok = string.match(rest, '^%d+')
if not tok then return {-1} end
local out = {string.sub(v, 1, i - 1), tok, redis.call('PTTL', KEYS[1])}
if #rest > #tok then
  -- `~<metadata>~` after the token.
  if #rest < #tok + 2 or string.byte(rest, #tok + 1) ~= 126
    or string.byte(rest, -1) ~= 126 then
    return {-1}
  end
  out[4] = string.sub(rest, #tok + 2, -2)
end
return out
"#;

/// [`Layout::Php`](crate::Layout::Php) locks keep the PHP original's keys; acquire without
/// metadata (see the file).
pub(super) const PHP_ACQUIRE: &str = include_str!("../lua/php_acquire.lua");

/// PHP-layout acquire with holder metadata (see the file).
pub(super) const PHP_ACQUIRE_META: &str = include_str!("../lua/php_acquire_meta.lua");

/// The rest of a PHP-layout acquire (see the file).
pub(super) const PHP_ACQUIRE_REST: &str = include_str!("../lua/php_acquire_rest.lua");

/// PHP layout: who holds a lock, read only (see the file).
pub(super) const PHP_INSPECT: &str = include_str!("../lua/php_inspect.lua");

/// PHP layout: compare-and-delete, then publish a wake-up (see the file).
pub(super) const PHP_RELEASE: &str = include_str!("../lua/php_release.lua");

/// PHP layout: compare-and-PEXPIRE (see the file).
pub(super) const PHP_EXTEND: &str = include_str!("../lua/php_extend.lua");

/// PHP layout: delete whoever holds it, then publish a wake-up (see the
/// file).
pub(super) const PHP_FORCE_RELEASE: &str = include_str!("../lua/php_force_release.lua");

/// The next token of a fencing source. KEYS: counter. ARGV: how long the
/// counter outlives its last use, in ms; '' keeps it for good (the PHP
/// layout's `fencing_token_<name>`, which the PHP side `INCR`s).
pub(super) const FENCE_NEXT: &str = r#"
if ARGV[1] == '' then return issue(KEYS[1]) end
local tok = next_token(redis.call('GET', KEYS[1]))
redis.call('SET', KEYS[1], tok, 'PX', ARGV[1])
return tok
"#;

/// Campaign (after the late-copy check, see [`late`](super::late)). KEYS: election hash
/// (owner, candidate, term; after a resignation only the last term, on the
/// rest of the TTL), the owner's mark. ARGV: owner, ttl ms, candidate,
/// channel, payload, stamp.
pub(super) const CAMPAIGN: &str = r#"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'term')
if cur[1] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, cur[2]}
end
if cur[1] then
  return {0, redis.call('PTTL', KEYS[1])}
end
local term = next_token(cur[2] or nil)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'candidate', ARGV[3], 'term', term)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return {1, term}
"#;

/// Renew leadership (after [`step`](super::step)). KEYS: election hash, the owner's
/// mark. ARGV: owner, ttl ms, stamp [, mark ttl ms].
pub(super) const ELECTION_RENEW: &str = r#"
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// The live leader as `inspect` shows it: `{}` when vacant, else
/// `{owner, candidate, term, pttl}`. KEYS: election hash. Read only.
pub(super) const ELECTION_INSPECT: &str = r#"
local cur = redis.call('HMGET', KEYS[1], 'owner', 'candidate', 'term')
if not cur[1] then return {} end
return {cur[1], cur[2] or '', cur[3] or '', redis.call('PTTL', KEYS[1])}
"#;

/// Resign: keep only the term, on the rest of the TTL, so the next term
/// rises above it even within the same µs. KEYS: election hash [, the
/// owner's mark (see [`mark`](super::mark))]. ARGV: owner, channel, payload [, stamp,
/// mark ttl ms].
pub(super) const RESIGN: &str = r#"
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'owner', 'candidate')
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"#;
