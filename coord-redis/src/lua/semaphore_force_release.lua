-- Remove every grant, whoever holds it, and wake the waiters that can now
-- be granted. ARGV: channel, name. Returns 1 if a live grant was removed.
prune()
local removed = redis.call('EXISTS', GE)
redis.call('DEL', GE, GI)
if redis.call('EXISTS', S) == 1 then redis.call('HSET', S, 'held', '0') end
wake()
keep()
return removed
