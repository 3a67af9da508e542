-- Release. ARGV: channel, name, owner, the client's stamp of the release,
-- marker ttl ms. Returns 1 if `owner` held a live grant (now returned),
-- else 0; its queue place goes either way, and the waiters the freed
-- permits can serve are woken. A release that finds `owner` not holding
-- (an acquire that timed out or was cancelled, leaving) marks it as left
-- for the marker ttl, so a late copy of one of its attempts, stamped
-- before this release, cannot queue it again or be granted (see
-- `semaphore_acquire.lua`). The marker lives no longer than the name's
-- other keys (`keep`): an idle name still leaves nothing.
prune()
local o = ARGV[3]
local g = redis.call('HGET', GI, o)
if g then
  redis.call('HDEL', GI, o)
  redis.call('ZREM', GE, o)
  redis.call('HINCRBY', S, 'held', -tonumber(string.match(g, '^(%d+)')))
else
  redis.call('HSET', LA, o, ARGV[4])
  redis.call('ZADD', LE, fmt(now_ms + tonumber(ARGV[5])), o)
end
leave(o)
wake()
keep()
if g then return 1 end
return 0
