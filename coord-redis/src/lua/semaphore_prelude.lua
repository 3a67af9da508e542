-- Shared by every semaphore script (after NOW and NEXT_TOKEN: `now` is the
-- server time in µs as a decimal string, `later` compares such strings).
--
-- KEYS (one hash slot, the name in a hash tag):
--   1 state hash: total, held (permits of live grants), qsum (permits
--     queued), last (last fencing token), qseq (last arrival number),
--     woke (the highest arrival number already sent a wake-up), wsum
--     (permits queued at arrival numbers up to `woke`)
--   2 grants: ZSET owner -> expiry (server ms)
--   3 holders: hash owner -> '<permits>:<token>', or
--     '<permits>:<token>:<metadata>' for a grant with holder metadata (so
--     the metadata goes wherever the grant goes: release, expiry, repair,
--     force release)
--   4 queue: ZSET owner -> arrival number (FIFO order)
--   5 queue expiry: ZSET owner -> expiry of the place (server ms)
--   6 queue permits: hash owner -> permits asked for
--   7 left: ZSET owner -> expiry (server ms) of the marker left by the
--     release of an owner that had an unanswered attempt (a copy of it
--     may still arrive)
--   8 left at: hash owner -> the client stamp of that release
-- ARGV[1]: the wake-up channel; ARGV[2]: the name.
-- A grant is live while its expiry is above the server clock (ms), a
-- queue place likewise. Every key lives exactly as long as the latest
-- grant, queue place or marker (`keep`), so an idle name leaves nothing.
--
-- Cost: every step is O(log n) in the queue length n plus O(1) per
-- waiter it wakes or per grant or place that expired. The queue keeps
-- one invariant instead of being walked: the places up to arrival number
-- `woke` all fit into the free permits together (wsum <= total - held),
-- and after every `wake` that prefix is the longest that fits. So a
-- queued waiter of the same size can be granted iff its arrival number is
-- at most `woke`, and a wake-up only looks at places after `woke`. (Only
-- a queued waiter asking for another number of permits than its place
-- holds needs the exact sum ahead of it: `rescan`, O(n).)
local S, GE, GI, QO, QE, QI, LE, LA =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function fmt(x) return string.format('%.0f', x) end
local function num(x) return tonumber(x) or 0 end

-- Remove `o`'s place in the queue, if any.
local function leave(o)
  local p = redis.call('HGET', QI, o)
  if not p then return end
  local seq = num(redis.call('ZSCORE', QO, o))
  redis.call('ZREM', QO, o)
  redis.call('ZREM', QE, o)
  redis.call('HDEL', QI, o)
  redis.call('HINCRBY', S, 'qsum', -tonumber(p))
  if seq <= num(redis.call('HGET', S, 'woke')) then
    redis.call('HINCRBY', S, 'wsum', -tonumber(p))
  end
end

-- A name whose keys disagree (one was lost: evicted under a maxmemory
-- policy, or deleted by hand) is rebuilt from what is left, as a lock
-- whose key is lost just ends: a grant missing its expiry or its permits
-- is dropped (its holder's extend then fails, so the guard reports it
-- lost), a queue place missing any of its parts too, and the sums are
-- counted again. O(1) while the keys agree (every key of a busy name
-- lives as long as the others); O(grants + places) once when they do not.
local function repair()
  local ng, nh = redis.call('ZCARD', GE), redis.call('HLEN', GI)
  local nq = redis.call('ZCARD', QO)
  local has_s = redis.call('EXISTS', S) == 1
  if ng == nh and nq == redis.call('ZCARD', QE) and nq == redis.call('HLEN', QI)
    and (has_s or (ng == 0 and nq == 0)) then
    return
  end
  local held, qsum, qseq = 0, 0, 0
  for _, o in ipairs(redis.call('HKEYS', GI)) do
    if not redis.call('ZSCORE', GE, o) then redis.call('HDEL', GI, o) end
  end
  for _, o in ipairs(redis.call('ZRANGE', GE, 0, -1)) do
    local g = redis.call('HGET', GI, o)
    if g then
      held = held + tonumber(string.match(g, '^(%d+)'))
    else
      redis.call('ZREM', GE, o)
    end
  end
  for _, o in ipairs(redis.call('HKEYS', QI)) do
    if not (redis.call('ZSCORE', QO, o) and redis.call('ZSCORE', QE, o)) then
      redis.call('HDEL', QI, o)
    end
  end
  for _, z in ipairs({QO, QE}) do
    for _, o in ipairs(redis.call('ZRANGE', z, 0, -1)) do
      if not redis.call('HGET', QI, o) then
        redis.call('ZREM', QO, o)
        redis.call('ZREM', QE, o)
      end
    end
  end
  for _, p in ipairs(redis.call('HVALS', QI)) do qsum = qsum + tonumber(p) end
  local top = redis.call('ZRANGE', QO, -1, -1, 'WITHSCORES')
  if top[2] then qseq = tonumber(top[2]) end
  qseq = math.max(qseq, num(redis.call('HGET', S, 'qseq')))
  -- No place counts as woken: the next `wake` walks the queue from its
  -- head again (a waiter woken twice only attempts once more).
  redis.call('HSET', S, 'held', fmt(held), 'qsum', fmt(qsum), 'qseq', fmt(qseq),
    'woke', '0', 'wsum', '0')
end

-- Drop expired grants, lapsed queue places and lapsed markers of left
-- owners, keeping the sums exact.
local function prune()
  repair()
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
  for _, o in ipairs(redis.call('ZRANGEBYSCORE', LE, '-inf', fmt(now_ms))) do
    redis.call('HDEL', LA, o)
    redis.call('ZREM', LE, o)
  end
end

local function publish(o)
  redis.call('PUBLISH', ARGV[1], 'semaphore:' .. o .. ':' .. ARGV[2])
end

-- Publish a wake-up to every queued waiter that can be granted now (the
-- longest prefix of the queue that fits into the free permits together)
-- and was not sent one before, except `me` (the waiter whose attempt is
-- running). Once grantable, a place stays grantable until it is granted
-- or leaves (grants never take permits from the prefix that fits), so one
-- wake-up per place is enough, and only the places after `woke` need a
-- look: the first that does not fit ends the walk.
local function wake(me)
  local woke = num(redis.call('HGET', S, 'woke'))
  local free = num(redis.call('HGET', S, 'total')) - num(redis.call('HGET', S, 'held'))
    - num(redis.call('HGET', S, 'wsum'))
  local add, top, from = 0, woke, '(' .. fmt(woke)
  while free > add do
    local batch = redis.call('ZRANGEBYSCORE', QO, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 16)
    if #batch == 0 then break end
    local fits = true
    for j = 1, #batch, 2 do
      local p = num(redis.call('HGET', QI, batch[j]))
      if add + p > free then fits = false break end
      add = add + p
      top = tonumber(batch[j + 1])
      if batch[j] ~= me then publish(batch[j]) end
    end
    if not fits then break end
    from = '(' .. batch[#batch]
  end
  if top > woke then
    redis.call('HSET', S, 'woke', fmt(top))
    redis.call('HINCRBY', S, 'wsum', add)
  end
  return top
end

-- Rebuild `woke` and `wsum` from the head of the queue (O(n)) and wake
-- who now fits and was not woken before (except `me`). With `want`,
-- returns the permits queued ahead of `me` (nil if `me` is not queued).
-- Needed only where the invariant above does not answer: a queued waiter
-- asking for another number of permits than its place holds.
local function rescan(me, want)
  local woke = num(redis.call('HGET', S, 'woke'))
  local free = num(redis.call('HGET', S, 'total')) - num(redis.call('HGET', S, 'held'))
  local need, top, wsum, ahead, fits, i, stop = 0, 0, 0, nil, true, 0, false
  while not stop do
    local batch = redis.call('ZRANGE', QO, i, i + 15, 'WITHSCORES')
    if #batch == 0 then break end
    for j = 1, #batch, 2 do
      if batch[j] == me then ahead = need end
      need = need + num(redis.call('HGET', QI, batch[j]))
      if fits and need <= free then
        local seq = tonumber(batch[j + 1])
        if seq > woke and batch[j] ~= me then publish(batch[j]) end
        top, wsum = seq, need
      else
        fits = false
      end
      if not fits and (ahead or not want) then stop = true break end
    end
    i = i + 16
  end
  redis.call('HSET', S, 'woke', fmt(top), 'wsum', fmt(wsum))
  return ahead
end

-- Let every key live until the latest grant, queue place or marker ends.
-- An idle name is deleted, except the last token while it is ahead of the
-- server clock (so the next grant still rises above it).
local function keep()
  local h = 0
  local g = redis.call('ZRANGE', GE, -1, -1, 'WITHSCORES')
  if g[2] then h = tonumber(g[2]) end
  local q = redis.call('ZRANGE', QE, -1, -1, 'WITHSCORES')
  if q[2] and tonumber(q[2]) > h then h = tonumber(q[2]) end
  local m = redis.call('ZRANGE', LE, -1, -1, 'WITHSCORES')
  if m[2] and tonumber(m[2]) > h then h = tonumber(m[2]) end
  if h > now_ms then
    local left = fmt(h - now_ms)
    for i = 1, 8 do redis.call('PEXPIRE', KEYS[i], left) end
    return
  end
  local last = redis.call('HGET', S, 'last')
  redis.call('DEL', S, GE, GI, QO, QE, QI, LE, LA)
  if last and later(last, now) then
    redis.call('HSET', S, 'last', last)
    redis.call('PEXPIRE', S, fmt(math.floor((tonumber(last) - tonumber(now)) / 1000) + 1))
  end
end
