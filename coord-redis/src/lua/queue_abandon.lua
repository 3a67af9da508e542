-- Abandon. ARGV: channel, name, lane, owner, how long it is remembered
-- (µs). The pop attempts of consumer `owner` had an outcome no caller saw:
-- remember it in S (field 'a:' .. owner, until when; a pop of it meanwhile
-- delivers nothing), and give back at once a message in flight to it, its
-- attempt count as before that delivery, waking a waiter of the lane.
-- Expired marks are dropped here. Returns 1 if a message was given back,
-- else 0.
local L = LANES[tonumber(ARGV[3])]
local owner = ARGV[4]
local fields = redis.call('HKEYS', S)
for _, k in ipairs(fields) do
  if string.sub(k, 1, 2) == 'a:' then
    local v = tonumber(redis.call('HGET', S, k))
    if not v or v <= now_us then redis.call('HDEL', S, k) end
  end
end
redis.call('HSET', S, 'a:' .. owner, fmt(now_us + tonumber(ARGV[5])))
local gave = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', L.TF, '(' .. now, '+inf')) do
  local m = held(L, id, owner)
  if m then
    redis.call('ZREM', L.TF, id)
    m.owner, m.at = '', ''
    if m.attempts > 0 then m.attempts = m.attempts - 1 end
    redis.call('ZADD', L.R, 0, member(m.group, id))
    putmeta(L, id, m)
    refresh(L, m.group)
    wake(L, false)
    gave = 1
    break
  end
end
tidy()
return gave
