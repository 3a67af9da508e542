-- Release. ARGV: channel, name, owner, the client's stamp of the release,
-- marker ttl ms (0: none). Returns 1 if `owner` held a live grant (now
-- returned), else 0; its queue place goes either way, and the waiters the
-- freed permits can serve are woken. With a marker ttl (the owner had an
-- attempt that went unanswered, so a copy of it may still arrive), the
-- owner is marked as left for that long, so a late copy stamped before
-- this release cannot queue it again or be granted (see
-- `semaphore_acquire.lua`). The marker keeps the name's state alive until
-- it lapses (`keep`).
prune()
local o = ARGV[3]
local g = redis.call('HGET', GI, o)
if g then
  redis.call('HDEL', GI, o)
  redis.call('ZREM', GE, o)
  redis.call('HINCRBY', S, 'held', -tonumber(string.match(g, '^(%d+)')))
end
if tonumber(ARGV[5]) > 0 then
  -- (A later step of the owner's higher mark is kept.)
  local was = redis.call('HGET', LA, o)
  if not was or tonumber(ARGV[4]) > tonumber(was) then
    redis.call('HSET', LA, o, ARGV[4])
    redis.call('ZADD', LE, fmt(now_ms + tonumber(ARGV[5])), o)
  end
end
leave(o)
wake()
keep()
if g then return 1 end
return 0
