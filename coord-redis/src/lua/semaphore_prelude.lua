-- Shared by every semaphore script (after NOW and NEXT_TOKEN: `now` is the
-- server time in µs as a decimal string, `later` compares such strings).
--
-- KEYS (one hash slot, the name in a hash tag):
--   1 state hash: total, held (permits of live grants), qsum (permits
--     queued), last (last fencing token), qseq (last arrival number),
--     woke (the highest arrival number already sent a wake-up)
--   2 grants: ZSET owner -> expiry (server ms)
--   3 holders: hash owner -> '<permits>:<token>'
--   4 queue: ZSET owner -> arrival number (FIFO order)
--   5 queue expiry: ZSET owner -> expiry of the place (server ms)
--   6 queue permits: hash owner -> permits asked for
-- ARGV[1]: the wake-up channel; ARGV[2]: the name.
-- A grant is live while its expiry is above the server clock (ms), a
-- queue place likewise. Every key lives exactly as long as the latest
-- grant or queue place (`keep`), so an idle name leaves nothing.
local S, GE, GI, QO, QE, QI = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function fmt(x) return string.format('%.0f', x) end
local function num(x) return tonumber(x) or 0 end

-- Remove `o`'s place in the queue, if any.
local function leave(o)
  local p = redis.call('HGET', QI, o)
  if not p then return end
  redis.call('ZREM', QO, o)
  redis.call('ZREM', QE, o)
  redis.call('HDEL', QI, o)
  redis.call('HINCRBY', S, 'qsum', -tonumber(p))
end

-- Drop expired grants and lapsed queue places, keeping the sums exact.
local function prune()
  for _, o in ipairs(redis.call('ZRANGEBYSCORE', GE, '-inf', fmt(now_ms))) do
    local g = redis.call('HGET', GI, o)
    if g then
      redis.call('HINCRBY', S, 'held', -tonumber(string.match(g, '^(%d+)')))
      redis.call('HDEL', GI, o)
    end
    redis.call('ZREM', GE, o)
  end
  for _, o in ipairs(redis.call('ZRANGEBYSCORE', QE, '-inf', fmt(now_ms))) do
    leave(o)
  end
end

-- Publish a wake-up to every queued waiter that can be granted now (the
-- longest prefix of the queue that fits into the free permits together)
-- and was not sent one before. Once grantable, a place stays grantable
-- until it is granted or leaves (grants never take permits from the
-- prefix that fits), so one wake-up per place is enough.
local function wake()
  local woke = num(redis.call('HGET', S, 'woke'))
  local free = num(redis.call('HGET', S, 'total')) - num(redis.call('HGET', S, 'held'))
  local need, top, i, done = 0, woke, 0, false
  while not done do
    local batch = redis.call('ZRANGE', QO, i, i + 15, 'WITHSCORES')
    if #batch == 0 then break end
    for j = 1, #batch, 2 do
      need = need + num(redis.call('HGET', QI, batch[j]))
      if need > free then done = true break end
      local seq = tonumber(batch[j + 1])
      if seq > woke then
        redis.call('PUBLISH', ARGV[1], 'semaphore:' .. batch[j] .. ':' .. ARGV[2])
        if seq > top then top = seq end
      end
    end
    i = i + 16
  end
  if top > woke then redis.call('HSET', S, 'woke', fmt(top)) end
end

-- Let every key live until the latest grant or queue place ends. An idle
-- name is deleted, except the last token while it is ahead of the server
-- clock (so the next grant still rises above it).
local function keep()
  local h = 0
  local g = redis.call('ZRANGE', GE, -1, -1, 'WITHSCORES')
  if g[2] then h = tonumber(g[2]) end
  local q = redis.call('ZRANGE', QE, -1, -1, 'WITHSCORES')
  if q[2] and tonumber(q[2]) > h then h = tonumber(q[2]) end
  if h > now_ms then
    local left = fmt(h - now_ms)
    for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], left) end
    return
  end
  local last = redis.call('HGET', S, 'last')
  redis.call('DEL', S, GE, GI, QO, QE, QI)
  if last and later(last, now) then
    redis.call('HSET', S, 'last', last)
    redis.call('PEXPIRE', S, fmt(math.floor((tonumber(last) - tonumber(now)) / 1000) + 1))
  end
end
