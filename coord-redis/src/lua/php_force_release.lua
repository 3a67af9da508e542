-- PHP layout: delete whoever holds it, then publish a wake-up.
-- KEYS: claim, grant. ARGV: channel, payload.
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return n
