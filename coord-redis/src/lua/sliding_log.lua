-- Sliding log: one sorted-set member per admitted request, carrying its
-- cost, so time and memory do not grow with the cost.
-- KEYS: [1] the log (member `<id>*<cost>`, score = time; members without
-- `*` -- the PHP's, or an older coord's one-per-unit ones -- count 1),
-- [2] the costs above 1 (member `<id>*<extra>`, where extra is the running
-- total of (cost - 1) over the key's life, less the offsets rebases took
-- away (see below), same score), [3] a hash: x = that running total,
-- xb = the total before the oldest entry of [2] still kept, r = the
-- retention window µs.
-- ARGV: limit, window µs, cost, request id, score unit (1 = µs scores,
-- 1000000 = seconds as the PHP writes them).
-- Entries are kept while younger than the LARGEST window the key has been
-- checked with since it was last idle (r); a check counts the entries
-- younger than ITS window against ITS limit. Units in (a, now] = the
-- number of log entries after a (ZCOUNT) + x - (extra total at a), all
-- O(log n) in the number of requests.
-- Exactness: x only grows while the key is busy, so every total is kept
-- small. Once xb (what has left the retention window) reaches 2^51, it
-- is subtracted from x, xb and the total of every kept member of [2]
-- (a rebase, which changes no difference between them). An admission
-- needs the kept entries' extras plus its own below 2^51 too, so x stays
-- below 2^52 and every number here is an exact integer. A key checked
-- with one window keeps less than its largest limit there (< 2^49), so
-- that never refuses what the quota admits; only a key mixing a long
-- window with short ones of huge limits could keep 2^51 units, and waits
-- then for the oldest to leave. A rebase rewrites only entries admitted since the
-- previous one (the older ones all stay below 2^51 after it): O(1)
-- amortised per admission.
local unit = tonumber(ARGV[5])
local st = redis.call('HMGET', KEYS[3], 'x', 'xb', 'r')
local x = tonumber(st[1] or '0')
local xb = tonumber(st[2] or '0')
local r = tonumber(st[3] or '0')
if win > r then r = win end

local function score(us)
  return string.format('%.17g', us / unit)
end
local function extra(member)
  return tonumber(string.match(member, '%*(%d+)$'))
end
-- The running extra total at (and including) score s.
local function extra_at(s)
  local e = redis.call('ZREVRANGEBYSCORE', KEYS[2], s, '-inf', 'LIMIT', 0, 1)
  if e[1] then return extra(e[1]) end
  return xb
end

-- Forget what is older than the retention window.
local cut = score(now - r)
local gone = redis.call('ZREVRANGEBYSCORE', KEYS[2], cut, '-inf', 'LIMIT', 0, 1)
if gone[1] then
  xb = extra(gone[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cut)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cut)

-- Rebase the totals once what has left the window reaches 2^51.
local big = 2251799813685248
if xb >= big then
  local kept = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #kept, 2 do
    local m = kept[i]
    local e = extra(m) - xb
    -- (Only a server clock gone back could order a total below xb.)
    if e < 0 then e = 0 end
    redis.call('ZREM', KEYS[2], m)
    redis.call('ZADD', KEYS[2], kept[i + 1], string.match(m, '^(.*%*)%d+$') .. int(e))
  end
  x = x - xb
  xb = 0
end

-- What this check's window holds.
local a = score(now - win)
local count = redis.call('ZCOUNT', KEYS[1], '(' .. a, '+inf')
local xa = extra_at(a)
local used = count + x - xa
local ttl = math.ceil(r / 1000)

-- Room to keep this request's extra cost exactly (see the top).
local room = x - xb + cost - 1 < big

if used + cost <= limit and room then
  local s = score(now)
  redis.call('ZADD', KEYS[1], s, ARGV[4] .. '*' .. ARGV[3])
  if cost > 1 then
    x = x + cost - 1
    redis.call('ZADD', KEYS[2], s, ARGV[4] .. '*' .. int(x))
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  redis.call('HSET', KEYS[3], 'x', int(x), 'xb', int(xb), 'r', int(r))
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  return {1, limit - used - cost, 0, win}
end
-- Denied: keep the (possibly larger) retention window.
redis.call('HSET', KEYS[3], 'x', int(x), 'xb', int(xb), 'r', int(r))
redis.call('PEXPIRE', KEYS[3], ttl)
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ttl) end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ttl) end

-- The score of the first entry of `key` among ranks lo..hi for which
-- enough(member, score) holds (it holds for every later one too), or nil:
-- a binary search over ranks, O(log^2 n).
local function first(key, lo, hi, enough)
  local found = nil
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local e = redis.call('ZRANGE', key, mid, mid, 'WITHSCORES')
    if enough(e[1], string.format('%.17g', tonumber(e[2]))) then
      found = tonumber(e[2])
      hi = mid - 1
    else
      lo = mid + 1
    end
  end
  return found
end

local retry = 1
-- Over the quota: the earliest entry in this window whose expiry frees
-- enough.
local need = used + cost - limit
if need > 0 then
  local total = redis.call('ZCARD', KEYS[1])
  local found = first(KEYS[1], total - count, total - 1, function(_, s)
    return redis.call('ZCOUNT', KEYS[1], '(' .. a, s) + extra_at(s) - xa >= need
  end)
  retry = win
  if found then retry = math.ceil(found * unit + win - now) end
end
-- No room: the earliest entry of [2] whose leaving the retention window
-- makes room.
if not room then
  local want = x + cost - big
  local found = first(KEYS[2], 0, redis.call('ZCARD', KEYS[2]) - 1, function(m)
    return extra(m) >= want
  end)
  local wait = r
  if found then wait = math.ceil(found * unit + r - now) end
  if wait > retry then retry = wait end
end
if retry < 1 then retry = 1 end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local reset = 0
if last[2] and count > 0 then reset = math.ceil(tonumber(last[2]) * unit + win - now) end
if reset < 0 then reset = 0 end
local remaining = limit - used
if remaining < 0 then remaining = 0 end
return {0, remaining, retry, reset}
