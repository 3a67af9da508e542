-- One attempt. ARGV: channel, name, owner, permits, total, ttl ms, '1' to
-- queue when refused, queue place ttl ms, longest hint ms, the client's
-- stamp of the attempt, and optionally the holder metadata to store with a
-- new grant (after its token: `<permits>:<token>:<metadata>`; a holder's
-- retry keeps its grant as it is).
-- Returns {1, token} granted (a holder's retry: the same token, TTL
-- refreshed), {0, ms until the next holder or queue place ends (at most
-- the hint)} refused, {-1, total} when the name is in use with another total.
--
-- An attempt stamped before a release that found its owner not holding
-- (a late copy of an attempt of an acquire that timed out or was
-- cancelled, and then left) is stale: refused, changing nothing, so it
-- neither restores the place its owner left nor takes permits nobody
-- will release.
prune()
local o, p, ttl = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[6])
local hint = tonumber(ARGV[9])
local gone = redis.call('HGET', LA, o)
if gone and tonumber(ARGV[10]) < tonumber(gone) then
  wake()
  keep()
  return {0, fmt(hint)}
end
local cur = redis.call('HGET', S, 'total')
if redis.call('EXISTS', GE) == 0 and redis.call('EXISTS', QO) == 0 then
  redis.call('HSET', S, 'total', ARGV[5], 'held', '0', 'qsum', '0', 'wsum', '0')
elseif not cur then
  -- The state hash was lost while grants or places live: `repair`
  -- counted the sums again; only the total is taken from this attempt.
  redis.call('HSET', S, 'total', ARGV[5])
elseif cur ~= ARGV[5] then
  return {-1, cur}
end
local g = redis.call('HGET', GI, o)
if g then
  redis.call('ZADD', GE, fmt(now_ms + ttl), o)
  keep()
  return {1, string.match(g, '^%d+:(%d+)')}
end
-- Pruning may have freed permits: wake who fits now (so `woke` ends the
-- longest prefix of the queue that fits), then decide.
local woke = wake(o)
local seq = redis.call('ZSCORE', QO, o)
local free = tonumber(ARGV[5]) - num(redis.call('HGET', S, 'held'))
local fits, resized
if seq then
  resized = num(redis.call('HGET', QI, o)) ~= p
  if resized then
    fits = rescan(o, true) + p <= free
  else
    fits = tonumber(seq) <= woke
  end
else
  fits = num(redis.call('HGET', S, 'qsum')) + p <= free
end
if fits then
  if seq then leave(o) end
  local tok = next_token(redis.call('HGET', S, 'last'))
  redis.call('HSET', S, 'last', tok)
  redis.call('HINCRBY', S, 'held', p)
  local grant = ARGV[4] .. ':' .. tok
  if ARGV[11] then grant = grant .. ':' .. ARGV[11] end
  redis.call('HSET', GI, o, grant)
  redis.call('ZADD', GE, fmt(now_ms + ttl), o)
  -- A grant of what every place ahead leaves free never makes another
  -- place fit or stop fitting, except a resized one's.
  if resized then rescan(o, false) end
  keep()
  return {1, tok}
end
if ARGV[7] == '1' then
  if not seq then
    redis.call('ZADD', QO, redis.call('HINCRBY', S, 'qseq', 1), o)
    redis.call('HSET', QI, o, ARGV[4])
    redis.call('HINCRBY', S, 'qsum', p)
  end
  redis.call('ZADD', QE, fmt(now_ms + tonumber(ARGV[8])), o)
end
-- The hint: the next grant or queue place to end (any place, not only
-- those ahead, so a waiter may look again early, never late).
local soonest = now_ms + hint
local first = redis.call('ZRANGE', GE, 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) < soonest then soonest = tonumber(first[2]) end
local q = redis.call('ZRANGE', QE, 0, 0, 'WITHSCORES')
if q[2] and tonumber(q[2]) < soonest then soonest = tonumber(q[2]) end
keep()
return {0, fmt(soonest - now_ms)}
