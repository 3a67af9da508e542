-- Fixed window. KEYS: hash (s = window start µs, n = its length µs, c =
-- count). ARGV: limit, window µs, cost. While the stored window runs
-- (now < s + n), a check counts in it against its own limit, whatever its
-- window; once it has ended, a window aligned for the checking quota
-- starts at count 0. So a quota change never grants a fresh allowance.
local st = redis.call('HMGET', KEYS[1], 's', 'n', 'c', 'w')
local s = tonumber(st[1])
local n = tonumber(st[2])
local c = tonumber(st[3] or '0')
if not s and st[4] then
  -- The previous layout: the index of a window of this quota's length.
  s = tonumber(st[4]) * win
  n = win
end
if not s or now >= s + n then
  local idx = divmod(now, win)
  s = idx * win
  n = win
  c = 0
end
local left = s + n - now
if c + cost <= limit then
  c = c + cost
  redis.call('HSET', KEYS[1], 's', int(s), 'n', int(n), 'c', int(c))
  redis.call('PEXPIRE', KEYS[1], math.ceil(left / 1000))
  return {1, limit - c, 0, left}
end
local reset = 0
if c > 0 then reset = left end
local remaining = limit - c
if remaining < 0 then remaining = 0 end
return {0, remaining, left, reset}
