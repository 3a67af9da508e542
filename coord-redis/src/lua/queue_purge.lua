-- Purge. ARGV: channel, name. Deletes every message of both lanes and every
-- dedup id; returns how many messages there were.
local n = redis.call('ZCARD', LANES[0].I) + redis.call('ZCARD', LANES[1].I)
redis.call('DEL', D, DE)
for i = 5, 22 do redis.call('DEL', KEYS[i]) end
tidy()
return n
