-- Nack. ARGV: channel, name, lane, id, owner, delay µs ('0': at once).
-- Gives the message back iff it is in flight to `owner` and its deadline
-- has not passed (attempts kept): ready at once, waking a waiter of the
-- lane, or delayed (waking a waiter if it comes due before anything else
-- on the lane's timelines). Returns 1, else 0.
local L = LANES[tonumber(ARGV[3])]
local id = ARGV[4]
local m = held(L, id, ARGV[5])
if not m then return 0 end
redis.call('ZREM', L.TF, id)
local delay = tonumber(ARGV[6])
m.owner = ''
if delay > 0 then
  m.at = fmt(now_us + delay)
  wake_if_sooner(L, m.at, earliest(L))
  redis.call('ZADD', L.TD, m.at, id)
else
  m.at = ''
  redis.call('ZADD', L.R, 0, member(m.group, id))
end
putmeta(L, id, m)
refresh(L, m.group)
if delay == 0 then wake(L, false) end
return 1
