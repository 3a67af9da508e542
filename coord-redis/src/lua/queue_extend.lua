-- Extend. ARGV: channel, name, lane, id, owner, visibility µs. Moves the
-- deadline of a live delivery to `owner` to now + visibility (never the
-- token or the attempt count). Returns 1, else 0.
local L = LANES[tonumber(ARGV[3])]
local id = ARGV[4]
local m = held(L, id, ARGV[5])
if not m then return 0 end
m.at = fmt(now_us + tonumber(ARGV[6]))
putmeta(L, id, m)
redis.call('ZADD', L.TF, m.at, id)
return 1
