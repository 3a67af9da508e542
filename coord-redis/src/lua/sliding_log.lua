-- Sliding log: one sorted-set member per admitted request, carrying its
-- cost, so time and memory do not grow with the cost.
-- KEYS: [1] the log (member `<id>*<cost>`, score = time; members without
-- `*` -- the seed PHP's, or an older coord's one-per-unit ones -- count 1),
-- [2] the costs above 1 (member `<id>*<extra>`, where extra is the running
-- total of (cost - 1) over the key's life, same score), [3] a hash:
-- x = that running total, xb = the total before the oldest entry of [2]
-- still kept, r = the retention window µs.
-- ARGV: limit, window µs, cost, request id, score unit (1 = µs scores,
-- 1000000 = seconds as the seed's PHP writes them).
-- Entries are kept while younger than the LARGEST window the key has been
-- checked with since it was last idle (r); a check counts the entries
-- younger than ITS window against ITS limit. Units in (a, now] = the
-- number of log entries after a (ZCOUNT) + x - (extra total at a), all
-- O(log n) in the number of requests.
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

-- What this check's window holds.
local a = score(now - win)
local count = redis.call('ZCOUNT', KEYS[1], '(' .. a, '+inf')
local xa = extra_at(a)
local used = count + x - xa
local ttl = math.ceil(r / 1000)

if used + cost <= limit then
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

-- The earliest entry whose expiry frees enough: binary search over ranks
-- of the entries in this window, O(log^2 n).
local need = used + cost - limit
local total = redis.call('ZCARD', KEYS[1])
local lo, hi = total - count, total - 1
local found = nil
while lo <= hi do
  local mid = math.floor((lo + hi) / 2)
  local e = redis.call('ZRANGE', KEYS[1], mid, mid, 'WITHSCORES')
  local s = string.format('%.17g', tonumber(e[2]))
  local units = redis.call('ZCOUNT', KEYS[1], '(' .. a, s) + extra_at(s) - xa
  if units >= need then
    found = tonumber(e[2])
    hi = mid - 1
  else
    lo = mid + 1
  end
end
local retry = win
if found then retry = math.ceil(found * unit + win - now) end
if retry < 1 then retry = 1 end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
local reset = 0
if last[2] and count > 0 then reset = math.ceil(tonumber(last[2]) * unit + win - now) end
if reset < 0 then reset = 0 end
local remaining = limit - used
if remaining < 0 then remaining = 0 end
return {0, remaining, retry, reset}
