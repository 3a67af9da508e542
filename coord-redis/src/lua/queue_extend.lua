-- Extend. ARGV: channel, name, lane, id, owner, visibility µs, stamp.
-- Moves the deadline of a live delivery to `owner` to now + visibility
-- (never the token or the attempt count), unless an extend of the owner
-- stamped at or after `stamp` was applied (a late copy: 2, changing
-- nothing). Returns 1, else 0.
local L = LANES[tonumber(ARGV[3])]
local id = ARGV[4]
local m = held(L, id, ARGV[5])
if not m then return 0 end
if m.step ~= '' and tonumber(ARGV[7]) <= tonumber(m.step) then return 2 end
m.at, m.step = fmt(now_us + tonumber(ARGV[6])), ARGV[7]
putmeta(L, id, m)
redis.call('ZADD', L.TF, m.at, id)
return 1
