-- Extend. ARGV: channel, name, owner, ttl ms, the client's stamp of the
-- extend, marker ttl ms (0: none). Moves a live grant's expiry to now +
-- ttl (never resurrects one that ended, never changes the token). An
-- extend stamped before the owner's live mark is a late copy overtaken by
-- a later step of its owner: it returns -1 and changes nothing (it would
-- set the expiry back to its own TTL). With a marker ttl (a step of the
-- owner went unanswered), the owner is marked as in
-- `semaphore_release.lua`: a late copy of that step, stamped before this
-- extend, would otherwise be taken for the holder retrying (or extending)
-- and set the grant's expiry back to its own TTL.
local gone = redis.call('HGET', LA, ARGV[3])
if gone and tonumber(ARGV[5]) < tonumber(gone)
  and num(redis.call('ZSCORE', LE, ARGV[3])) > now_ms then
  return -1
end
repair()
if tonumber(ARGV[6]) > 0 then
  redis.call('HSET', LA, ARGV[3], ARGV[5])
  redis.call('ZADD', LE, fmt(now_ms + tonumber(ARGV[6])), ARGV[3])
end
local e = tonumber(redis.call('ZSCORE', GE, ARGV[3]))
if not e or e <= now_ms then
  -- `repair` may have written the state hash: give it its lifetime.
  keep()
  return 0
end
redis.call('ZADD', GE, fmt(now_ms + tonumber(ARGV[4])), ARGV[3])
keep()
return 1
