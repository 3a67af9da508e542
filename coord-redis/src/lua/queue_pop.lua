-- One delivery attempt. ARGV: channel, name, lane (0 main, 1 dead), owner,
-- visibility µs, max deliveries ('' for never), '1' for ordered groups,
-- '1' if the calling client has a waiter on the lane, how long its
-- waiting mark lasts (µs).
-- Returns {1, token, id, attempts, enqueued ms, group, payload} delivered,
-- or {0, µs until the next delayed message or deadline (-1: none)}.
--
-- The rule of `coord_core::queue_backend`: the candidate of the group
-- with the lowest turn (ties: the lowest id; the lane's clock rises to the
-- delivered group's turn, which becomes the clock + 1), a group's candidate being
-- its lowest ready id (ordered: its lowest id, if ready); a candidate
-- delivered max-deliveries times goes to the dead lane and the next is
-- considered.
local li = tonumber(ARGV[3])
local L, DL = LANES[li], LANES[1]
-- An abandoned consumer (queue_abandon.lua): a copy of its attempt that
-- lands late delivers nothing.
local abandoned = redis.call('HGET', S, 'a:' .. ARGV[4])
if abandoned and tonumber(abandoned) > now_us then return {0, -1} end
advance(L)
local maxd = tonumber(ARGV[6])
if li ~= 0 then maxd = nil end
local Z = L.C
if ARGV[7] == '1' then Z = L.O end
local dead = 0
for _ = 1, MOVES do
  local top = redis.call('ZRANGE', Z, 0, 0)[1]
  if not top then break end
  local id, g = unpad(string.sub(top, 1, 20)), string.sub(top, 21)
  local m = id and getmeta(L, id)
  local body = m and redis.call('HGET', B, id)
  if not (m and m.at == '' and m.group == g) then
    -- An index entry that disagrees with the message (only after keys
    -- were lost): drop it and look again.
    redis.call('ZREM', Z, top)
    if id then redis.call('ZREM', L.R, member(g, id)) end
    refresh(L, g)
  elseif not body then
    -- The body was lost (evicted): the message cannot be delivered.
    remove(L, id, m)
  elseif maxd and m.attempts >= maxd then
    remove(L, id, m)
    m.at, m.owner = '', ''
    insert(DL, id, m)
    dead = dead + 1
  else
    -- The rule's clock: V = max(V, turn(g)), then turn(g) = V + 1.
    local cur = redis.call('HGET', L.G, g)
    local clock = tonumber(redis.call('HGET', S, L.v) or '0')
    local turn = tonumber((cur and string.match(cur, '^(%d+):')) or clock)
    if clock > turn then turn = clock end
    turn = fmt(turn)
    redis.call('HSET', S, L.v, turn)
    redis.call('ZREM', L.R, member(g, id))
    m.attempts = m.attempts + 1
    m.at, m.owner, m.step = fmt(now_us + tonumber(ARGV[5])), ARGV[4], ''
    putmeta(L, id, m)
    redis.call('ZADD', L.TF, m.at, id)
    refresh(L, g, fmt(tonumber(turn) + 1))
    local tok = next_token(redis.call('HGET', S, 'last'))
    redis.call('HSET', S, 'last', tok)
    if dead > 0 then wake(DL, false) end
    return {1, tok, id, m.attempts, m.enq, g, body}
  end
end
if dead > 0 then wake(DL, false) end
if redis.call('ZCARD', Z) > 0 then
  -- MOVES candidates were dead-lettered or dropped: more on the next step.
  return {0, 0}
end
if ARGV[8] == '1' then redis.call('HSET', S, L.w, fmt(now_us + tonumber(ARGV[9]))) end
local nxt
for _, z in ipairs({ L.TD, L.TF }) do
  local f = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if f[2] then
    local d = tonumber(f[2]) - now_us
    if not nxt or d < nxt then nxt = d end
  end
end
tidy()
if not nxt then return {0, -1} end
if nxt < 0 then nxt = 0 end
return {0, fmt(nxt)}
