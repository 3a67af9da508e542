-- Extend. ARGV: channel, name, owner, ttl ms. Moves a live grant's expiry
-- to now + ttl (never resurrects one that ended, never changes the token).
repair()
local e = tonumber(redis.call('ZSCORE', GE, ARGV[3]))
if not e or e <= now_ms then
  -- `repair` may have written the state hash: give it its lifetime.
  keep()
  return 0
end
redis.call('ZADD', GE, fmt(now_ms + tonumber(ARGV[4])), ARGV[3])
keep()
return 1
