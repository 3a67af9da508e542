-- Sliding-window counter: the count of the current aligned window plus the
-- previous window's count weighted by its overlap with the trailing
-- window. KEYS: hash (w = window index, c = current count, p = previous,
-- n = window length µs). ARGV: limit, window µs, cost.
-- A changed limit just compares against the new limit. A changed window
-- takes the estimate under the old window (rounded up) as the count of the
-- new window's current slot, previous 0. Exact: the weighted part is
-- computed as an integer quotient and remainder.
local idx = divmod(now, win)
local st = redis.call('HMGET', KEYS[1], 'w', 'c', 'p', 'n')
local c, p = 0, 0
if st[1] then
  local w = tonumber(st[1])
  local n = tonumber(st[4] or ARGV[2])
  c = tonumber(st[2] or '0')
  p = tonumber(st[3] or '0')
  local i = idx
  if n ~= win then i = divmod(now, n) end
  if w ~= i then
    if w == i - 1 then p = c else p = 0 end
    c = 0
  end
  if n ~= win then
    local q, m = muldiv(p, n - (now - i * n), n)
    c = c + q
    if m > 0 then c = c + 1 end
    p = 0
  end
end
local elapsed = now - idx * win
-- The previous window's weight: q + m / win.
local q, m = muldiv(p, win - elapsed, win)
local frac = 0
if m > 0 then frac = 1 end
if c + q + frac + cost <= limit then
  c = c + cost
  redis.call('HSET', KEYS[1], 'w', int(idx), 'c', int(c), 'p', int(p), 'n', int(win))
  redis.call('PEXPIRE', KEYS[1], math.ceil(2 * win / 1000))
  return {1, limit - c - q - frac, 0, math.ceil((idx + 2) * win - now)}
end
local retry
if p > 0 and c + cost <= limit then
  retry = (win - (limit - c - cost) * win / p) - elapsed
else
  local e2 = 0
  if c > 0 then e2 = win - (limit - cost) * win / c end
  if e2 < 0 then e2 = 0 end
  retry = (idx + 1) * win - now + e2
end
retry = math.ceil(retry)
if retry < 1 then retry = 1 end
local reset = 0
if c > 0 then
  reset = (idx + 2) * win - now
elseif p > 0 then
  reset = (idx + 1) * win - now
end
local remaining = limit - c - q - frac
if remaining < 0 then remaining = 0 end
return {0, remaining, retry, reset}
