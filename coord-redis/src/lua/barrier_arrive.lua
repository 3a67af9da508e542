-- Arrive at a barrier. KEYS: state hash (gen, parties, last, base), members
-- of the open generation (set), the open generation's arrival ids (hash
-- id -> participant; an empty participant marks a withdrawn id, a
-- tombstone), the arrival ids of the generation that completed last (set).
-- ARGV: parties, participant, channel, payload, arrival id, grace ms.
-- An arrival id of the last completed generation (a retry whose reply was
-- lost) returns that generation as complete and changes nothing. A
-- withdrawn arrival id (a late copy of an arrival whose wait gave up), or
-- one stamped no later than an arrival of its participant that passed or
-- was withdrawn,
-- changes nothing and returns `{-2, 0}`.
-- Arriving again in the open generation counts once (a second arrival id
-- of a member is recorded, so each is withdrawn on its own); after the
-- generation completed, the same participant's next arrival (a new id)
-- joins the next one (reusable barrier, as the reference backend does).
-- State lives for the grace after the last arrival or check (`barrier_is_complete.lua`
-- refreshes it while anybody waits). A barrier with no state starts its
-- generations at the server time in µs (`base`), so generations never
-- repeat after the state expired or was lost, and a waiter of an older one
-- can tell it is gone.
-- Returns `{generation, complete}`, or `{-1, parties}` when the open
-- generation was started with another party count.
local function keep()
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ARGV[6]) end
end
if redis.call('SISMEMBER', KEYS[4], ARGV[5]) == 1 then
  return {tonumber(redis.call('HGET', KEYS[1], 'last')), 1}
end
local who = redis.call('HGET', KEYS[3], ARGV[5])
if who == '' then
  return {-2, 0}
end
-- Each participant's newest arrival stamp among those that passed or were
-- withdrawn (`a:<participant>` in the state hash; an arrival id's first 16 hex
-- digits are its stamp, µs, exact in a Lua number): an arrival of the
-- participant stamped no later is a late copy of a wait that has ended,
-- whose generation may have completed long ago, and counts nowhere.
local function stamp_of(id)
  return tonumber(string.sub(id, 1, 16), 16)
end
if not who then
  local passed = redis.call('HGET', KEYS[1], 'a:' .. ARGV[2])
  if passed and stamp_of(ARGV[5]) <= tonumber(passed) then
    return {-2, 0}
  end
end
local gen = tonumber(redis.call('HGET', KEYS[1], 'gen'))
if not gen then
  local t = redis.call('TIME')
  gen = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', KEYS[1], 'base', string.format('%.0f', gen))
end
local n = redis.call('SCARD', KEYS[2])
if n > 0 then
  local p = redis.call('HGET', KEYS[1], 'parties')
  if p and p ~= ARGV[1] then
    return {-1, tonumber(p)}
  end
end
if who then
  keep()
  return {gen, 0}
end
local member = redis.call('SISMEMBER', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[1], 'parties', ARGV[1], 'gen', string.format('%.0f', gen))
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[5], ARGV[2])
if member == 0 and n + 1 >= tonumber(ARGV[1]) then
  local all = redis.call('HGETALL', KEYS[3])
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
  for i = 1, #all, 2 do
    if all[i + 1] ~= '' then redis.call('SADD', KEYS[4], all[i]) end
  end
  redis.call('HSET', KEYS[1], 'gen', string.format('%.0f', gen + 1),
    'last', string.format('%.0f', gen))
  -- Every participant that passed: its newest stamp. Stamps more than
  -- 30 s older than the newest are forgotten.
  local newest = 0
  for i = 1, #all, 2 do
    if all[i + 1] ~= '' then
      local f, t = 'a:' .. all[i + 1], stamp_of(all[i])
      local was = tonumber(redis.call('HGET', KEYS[1], f) or '0')
      if t > was then redis.call('HSET', KEYS[1], f, string.format('%.0f', t)) end
      if t > newest then newest = t end
    end
  end
  local state = redis.call('HGETALL', KEYS[1])
  for i = 1, #state, 2 do
    if string.sub(state[i], 1, 2) == 'a:' and tonumber(state[i + 1]) + 30000000 < newest then
      redis.call('HDEL', KEYS[1], state[i])
    end
  end
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  keep()
  return {gen, 1}
end
keep()
return {gen, 0}
