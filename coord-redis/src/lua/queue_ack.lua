-- Ack. ARGV: channel, name, lane, id, owner. Deletes the message iff it is
-- in flight to `owner` and its deadline has not passed; returns 1, else 0.
-- Wakes the lane's waiters when the acked message was holding up its
-- ordered group's next one.
local L = LANES[tonumber(ARGV[3])]
local id = ARGV[4]
local m = held(L, id, ARGV[5])
if not m then return 0 end
redis.call('HDEL', B, id)
local more, before, after = remove(L, id, m)
if more and after ~= '' and after ~= before then wake(L, false) end
tidy()
return 1
