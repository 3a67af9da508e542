-- Release. ARGV: channel, name, owner. Returns 1 if `owner` held a live
-- grant (now returned), else 0; its queue place goes either way, and the
-- waiters the freed permits can serve are woken.
prune()
local o = ARGV[3]
local g = redis.call('HGET', GI, o)
if g then
  redis.call('HDEL', GI, o)
  redis.call('ZREM', GE, o)
  redis.call('HINCRBY', S, 'held', -tonumber(string.match(g, '^(%d+)')))
end
leave(o)
wake()
keep()
if g then return 1 end
return 0
