-- Push. ARGV: channel, name, payload, delay µs ('0': ready at once),
-- group ('' for none), dedup id ('' for none), dedup window µs.
-- Returns {1, id} for a new message, {0, id} for a duplicate of a dedup id
-- pushed within its window (nothing changed). Wakes a waiter of the main
-- lane for a message ready at once, or for a delayed one that comes due
-- before anything else on the lane's timelines.
--
-- Ids are max(last id + 1, server µs), so they rise in push order and
-- keep rising after the queue's state was deleted (an idle queue) or lost.
local dedup = ARGV[6]
if dedup ~= '' then
  for _, d in ipairs(redis.call('ZRANGEBYSCORE', DE, '-inf', now, 'LIMIT', 0, 64)) do
    redis.call('HDEL', D, d)
    redis.call('ZREM', DE, d)
  end
  local first = redis.call('HGET', D, dedup)
  local until_us = tonumber(redis.call('ZSCORE', DE, dedup))
  if first and until_us and until_us > now_us then return {0, first} end
end
local id = next_token(redis.call('HGET', S, 'seq'))
redis.call('HSET', S, 'seq', id)
redis.call('PERSIST', S)
if dedup ~= '' then
  redis.call('HSET', D, dedup, id)
  redis.call('ZADD', DE, fmt(now_us + tonumber(ARGV[7])), dedup)
  -- Both live exactly as long as their latest dedup id.
  local last = redis.call('ZRANGE', DE, -1, -1, 'WITHSCORES')
  local left = fmt(math.floor((tonumber(last[2]) - now_us) / 1000) + 1)
  redis.call('PEXPIRE', D, left)
  redis.call('PEXPIRE', DE, left)
end
local delay = tonumber(ARGV[4])
local L = LANES[0]
local at, before = '', nil
if delay > 0 then
  at = fmt(now_us + delay)
  before = earliest(L)
end
redis.call('HSET', B, id, ARGV[3])
insert(L, id, { attempts = 0, enq = fmt(math.floor(now_us / 1000)), at = at, owner = '',
  group = ARGV[5] })
if delay == 0 then
  wake(L, false)
else
  wake_if_sooner(L, at, before)
end
return {1, id}
