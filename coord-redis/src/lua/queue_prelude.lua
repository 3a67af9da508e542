-- Shared by every queue script (after NOW and NEXT_TOKEN: `now` is the
-- server time in µs as a decimal string).
--
-- KEYS (one hash slot, the queue name in a hash tag):
--   1 S state hash: seq (last message id), last (last fencing token, one
--     sequence for both lanes), v0/v1 (each lane's virtual clock), w0/w1
--     (until when, in server µs, somebody waits on the lane: wake-ups are
--     published only while that mark is live)
--   2 B bodies: hash id -> payload (both lanes: a message keeps its body
--     when it moves between lanes)
--   3 D dedup ids: hash dedup id -> message id
--   4 DE dedup expiry: ZSET dedup id -> expiry (server µs)
--   then 9 keys per lane, main (5..13) and dead (14..22):
--   +1 M meta: hash id -> 'attempts:enqueued ms:at µs:owner:step:group',
--      `at` the deadline of a delivery (with `owner`) or the end of a delay
--      (without), both empty when ready; `step` the stamp of the last
--      extend applied for `owner` (empty without), so that a late copy of
--      an earlier one is refused
--   +2 I ids: ZSET id -> id (every message of the lane, by id)
--   +3 A all: lex ZSET group .. '\0' .. pad(id) (every message, by group)
--   +4 R ready: lex ZSET, as A, of the ready messages
--   +5 TD delayed: ZSET id -> visible at (server µs)
--   +6 TF in flight: ZSET id -> deadline (server µs)
--   +7 G groups: hash group -> 'turn:cid:ocid' for every group with a
--      message in the lane: its turn, its candidate (lowest ready id) and
--      its ordered candidate (its lowest id, if ready), ids or ''
--   +8 C candidates: ZSET pad(cid) .. group -> turn (ZSET order is score,
--      then member: the lowest turn, ties by the lowest id)
--   +9 O ordered candidates: ZSET pad(ocid) .. group -> turn
-- ARGV[1]: the wake-up channel; ARGV[2]: the queue name.
--
-- Ids, deadlines and tokens are below 2^53, so Lua numbers and ZSET
-- scores hold them exactly. Group names never contain '\0' or '\1' (the
-- core refuses control characters), so the lex range of group g in A or
-- R is ['g\0', 'g\1').
local S, B, D, DE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now_us = tonumber(now)
local function fmt(x) return string.format('%.0f', x) end

local function lane_keys(i, name)
  local b = 4 + i * 9
  return { M = KEYS[b + 1], I = KEYS[b + 2], A = KEYS[b + 3], R = KEYS[b + 4],
    TD = KEYS[b + 5], TF = KEYS[b + 6], G = KEYS[b + 7], C = KEYS[b + 8],
    O = KEYS[b + 9], v = 'v' .. i, w = 'w' .. i, name = name, index = i }
end
local LANES = { [0] = lane_keys(0, 'main'), [1] = lane_keys(1, 'dead') }

-- How many due timeline entries one step brings up to date (per kind),
-- and how many candidates one pop looks at (dead-lettered or dropped as
-- inconsistent) before it gives up for this step.
local BATCH, MOVES = 256, 256

local function pad(id) return string.rep('0', 20 - #id) .. id end
local function unpad(p) return string.match(p, '^0*(%d+)$') end
local function member(g, id) return g .. '\0' .. pad(id) end

local function getmeta(L, id)
  local v = redis.call('HGET', L.M, id)
  if not v then return nil end
  local a, e, at, o, st, g = string.match(v, '^(%d+):(%d+):(%d*):(%x*):(%d*):(.*)$')
  if not a then return nil end
  return { attempts = tonumber(a), enq = e, at = at, owner = o, step = st, group = g }
end

-- A step stamp lives as long as its owner: a message given back or
-- delivered to another consumer starts without one.
local function putmeta(L, id, m)
  local step = (m.owner ~= '' and m.step) or ''
  redis.call('HSET', L.M, id, fmt(m.attempts) .. ':' .. m.enq .. ':' .. m.at .. ':' .. m.owner
    .. ':' .. step .. ':' .. m.group)
end

-- Bring group g's entries (G, C, O) up to date with A and R, with `turn`
-- as its new turn if given. A group that just got its first message
-- starts at the lane's clock + 1 (after the turn being served, so one that
-- leaves and comes back does not go before groups that waited); one left
-- without messages is forgotten.
-- Returns whether the group has messages, and its ordered candidate
-- before and after.
local function refresh(L, g, turn)
  local cur = redis.call('HGET', L.G, g)
  local oturn, ocid, oocid = nil, '', ''
  if cur then
    local t, c, o = string.match(cur, '^(%d+):(%d*):(%d*)$')
    if t then oturn, ocid, oocid = t, c, o end
  end
  local lo, hi = '[' .. g .. '\0', '(' .. g .. '\1'
  local first = redis.call('ZRANGEBYLEX', L.A, lo, hi, 'LIMIT', 0, 1)[1]
  if not first then
    if ocid ~= '' then redis.call('ZREM', L.C, pad(ocid) .. g) end
    if oocid ~= '' then redis.call('ZREM', L.O, pad(oocid) .. g) end
    if cur then redis.call('HDEL', L.G, g) end
    return false, oocid, ''
  end
  turn = turn or oturn or fmt(tonumber(redis.call('HGET', S, L.v) or '0') + 1)
  local r = redis.call('ZRANGEBYLEX', L.R, lo, hi, 'LIMIT', 0, 1)[1]
  local cid, ocd = '', ''
  if r then
    cid = unpad(string.sub(r, -20))
    if r == first then ocd = cid end
  end
  if ocid ~= '' and ocid ~= cid then redis.call('ZREM', L.C, pad(ocid) .. g) end
  if cid ~= '' then redis.call('ZADD', L.C, turn, pad(cid) .. g) end
  if oocid ~= '' and oocid ~= ocd then redis.call('ZREM', L.O, pad(oocid) .. g) end
  if ocd ~= '' then redis.call('ZADD', L.O, turn, pad(ocd) .. g) end
  redis.call('HSET', L.G, g, turn .. ':' .. cid .. ':' .. ocd)
  return true, oocid, ocd
end

-- Add message `id` (meta `m`: ready if m.at is '', else delayed until it).
local function insert(L, id, m)
  putmeta(L, id, m)
  redis.call('ZADD', L.I, id, id)
  local mem = member(m.group, id)
  redis.call('ZADD', L.A, 0, mem)
  if m.at == '' then
    redis.call('ZADD', L.R, 0, mem)
  else
    redis.call('ZADD', L.TD, m.at, id)
  end
  refresh(L, m.group)
end

-- Remove message `id` (meta `m`) from the lane, keeping its body.
local function remove(L, id, m)
  redis.call('HDEL', L.M, id)
  redis.call('ZREM', L.I, id)
  local mem = member(m.group, id)
  redis.call('ZREM', L.A, mem)
  redis.call('ZREM', L.R, mem)
  redis.call('ZREM', L.TD, id)
  redis.call('ZREM', L.TF, id)
  return refresh(L, m.group)
end

-- Make due delayed messages and lapsed deliveries ready (at most BATCH of
-- each per step; the rest on the next steps).
local function advance(L)
  local touched = {}
  for _, z in ipairs({ L.TD, L.TF }) do
    local due = redis.call('ZRANGEBYSCORE', z, '-inf', now, 'LIMIT', 0, BATCH)
    for _, id in ipairs(due) do
      redis.call('ZREM', z, id)
      local m = getmeta(L, id)
      if m then
        m.at, m.owner = '', ''
        putmeta(L, id, m)
        redis.call('ZADD', L.R, 0, member(m.group, id))
        touched[m.group] = true
      end
    end
  end
  for g in pairs(touched) do refresh(L, g) end
end

-- The live delivery of `id` to `owner`, or nil.
local function held(L, id, owner)
  local m = getmeta(L, id)
  if m and m.owner == owner and m.at ~= '' and tonumber(m.at) > now_us then return m end
  return nil
end

-- Publish a wake-up for the lane's waiters (all of them with `all`), if
-- anybody waits on it.
local function wake(L, all)
  local w = redis.call('HGET', S, L.w)
  if w and tonumber(w) > now_us then
    local kind = all and 'queue-all:' or 'queue:'
    redis.call('PUBLISH', ARGV[1], kind .. L.name .. ':' .. ARGV[2])
  end
end

-- The lane's next time something comes due (a delayed message or a
-- delivery's deadline), in server µs, or nil.
local function earliest(L)
  local t
  for _, z in ipairs({ L.TD, L.TF }) do
    local f = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    if f[2] and (not t or tonumber(f[2]) < t) then t = tonumber(f[2]) end
  end
  return t
end

-- A message that comes due at `at` (server µs): wake a waiter if that is
-- sooner than anything on the lane's timelines before (`before`), so it
-- attempts again and learns when (`next_in`) instead of at its next poll.
-- (A waiter that was told a time keeps it until something sooner comes.)
local function wake_if_sooner(L, at, before)
  if not before or tonumber(at) < before then wake(L, false) end
end

-- A queue without messages keeps only what must outlive them, on a TTL:
-- the last id and token while they are ahead of the server clock (so the
-- next ones still rise above them), live waiting marks and live marks of
-- abandoned consumers ('a:' .. owner). Dedup ids expire on their own.
local function tidy()
  if redis.call('EXISTS', LANES[0].I) == 1 or redis.call('EXISTS', LANES[1].I) == 1 then
    return
  end
  local f = redis.call('HGETALL', S)
  local all = { S, B }
  for i = 5, 22 do all[#all + 1] = KEYS[i] end
  redis.call('DEL', unpack(all))
  local keep, till = {}, now_us
  for i = 1, #f, 2 do
    local k, v = f[i], f[i + 1]
    local kept = k == 'seq' or k == 'last' or k == 'w0' or k == 'w1' or string.sub(k, 1, 2) == 'a:'
    if kept and tonumber(v) and tonumber(v) > now_us then
      keep[#keep + 1] = k
      keep[#keep + 1] = v
      if tonumber(v) > till then till = tonumber(v) end
    end
  end
  if #keep > 0 then
    redis.call('HSET', S, unpack(keep))
    redis.call('PEXPIRE', S, fmt(math.floor((till - now_us) / 1000) + 1))
  end
end
