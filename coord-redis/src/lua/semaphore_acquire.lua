-- One attempt. ARGV: channel, name, owner, permits, total, ttl ms, '1' to
-- queue when refused, queue place ttl ms, longest hint ms.
-- Returns {1, token} granted (a holder's retry: the same token, TTL
-- refreshed), {0, ms until the next holder or place ahead ends (at most
-- the hint)} refused, {-1, total} when the name is in use with another total.
prune()
local o, p, ttl = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[6])
local cur = redis.call('HGET', S, 'total')
if not cur or (redis.call('EXISTS', GE) == 0 and redis.call('EXISTS', QO) == 0) then
  redis.call('HSET', S, 'total', ARGV[5], 'held', '0', 'qsum', '0')
elseif cur ~= ARGV[5] then
  return {-1, cur}
end
local g = redis.call('HGET', GI, o)
if g then
  redis.call('ZADD', GE, fmt(now_ms + ttl), o)
  keep()
  return {1, string.match(g, ':(%d+)$')}
end
local rank = redis.call('ZRANK', QO, o)
local ahead, soonest = 0, now_ms + tonumber(ARGV[9])
if rank then
  if rank > 0 then
    for _, w in ipairs(redis.call('ZRANGE', QO, 0, rank - 1)) do
      ahead = ahead + num(redis.call('HGET', QI, w))
      local e = tonumber(redis.call('ZSCORE', QE, w))
      if e and e < soonest then soonest = e end
    end
  end
else
  ahead = num(redis.call('HGET', S, 'qsum'))
  local q = redis.call('ZRANGE', QE, 0, 0, 'WITHSCORES')
  if q[2] and tonumber(q[2]) < soonest then soonest = tonumber(q[2]) end
end
local free = tonumber(ARGV[5]) - num(redis.call('HGET', S, 'held'))
if ahead + p <= free then
  if rank then leave(o) end
  local tok = next_token(redis.call('HGET', S, 'last'))
  redis.call('HSET', S, 'last', tok)
  redis.call('HINCRBY', S, 'held', p)
  redis.call('HSET', GI, o, ARGV[4] .. ':' .. tok)
  redis.call('ZADD', GE, fmt(now_ms + ttl), o)
  wake()
  keep()
  return {1, tok}
end
local first = redis.call('ZRANGE', GE, 0, 0, 'WITHSCORES')
if first[2] and tonumber(first[2]) < soonest then soonest = tonumber(first[2]) end
if ARGV[7] == '1' then
  if not rank then
    redis.call('ZADD', QO, redis.call('HINCRBY', S, 'qseq', 1), o)
    redis.call('HSET', QI, o, ARGV[4])
    redis.call('HINCRBY', S, 'qsum', p)
  end
  redis.call('ZADD', QE, fmt(now_ms + tonumber(ARGV[8])), o)
end
-- Pruning may have freed permits for waiters queued elsewhere.
wake()
keep()
return {0, fmt(soonest - now_ms)}
