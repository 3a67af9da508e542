-- GCRA. The theoretical arrival time is kept exactly as TAT = t + r / l
-- µs (t an integer µs, 0 <= r < l), with the quota it was computed for.
-- KEYS: hash (t, r, l = limit, w = window µs). ARGV: limit, window µs,
-- cost. Emission interval T = window / limit; a request of cost k is
-- admitted iff max(TAT, now) + k*T - now <= window (bursts of up to
-- limit). Every step is integer arithmetic, so no sub-µs part of T is
-- ever rounded away.
-- A changed quota carries the backlog over, rescaled: owed requests =
-- backlog / (w_old / l_old); new TAT = now + owed * (w / l), rounded up to
-- the next 1/l µs.
local ti, r = now, 0
local st = redis.pcall('HMGET', KEYS[1], 't', 'r', 'l', 'w')
if st.err then
  -- The previous layout: the TAT as a decimal µs string, for this quota.
  local old = tonumber(redis.call('GET', KEYS[1]))
  redis.call('DEL', KEYS[1])
  if old and old > now then ti = math.ceil(old) end
elseif st[1] then
  local t0, r0 = tonumber(st[1]), tonumber(st[2])
  local l0, w0 = tonumber(st[3]), tonumber(st[4])
  if t0 > now or (t0 == now and r0 > 0) then
    if l0 == limit and w0 == win then
      ti, r = t0, r0
    else
      -- Backlog in 1/l0 µs: x = (t0 - now) * l0 + r0; in 1/limit µs it is
      -- ceil(x * win / w0).
      local x = bigmul(big(t0 - now), l0, r0)
      local q, m = bigdiv(bigmul(x, win), w0)
      if m > 0 then q = q + 1 end
      local d
      d, r = divmod(q, limit)
      ti = now + d
    end
  end
end
-- new TAT = TAT + cost * win / limit
local q, m = muldiv(cost, win, limit)
local ni, nr = ti + q, r + m
if nr >= limit then
  ni = ni + 1
  nr = nr - limit
end
local diff = ni - now
local up = 0
if nr > 0 then up = 1 end
-- floor((win - backlog) * limit / win) for a backlog of (d + f / limit) µs.
local function left(d, f)
  if d > win or (d == win and f > 0) then return 0 end
  local q0, m0 = muldiv(win - d, limit, win)
  local k0 = divmod(f, win) + 1
  local n = q0 + divmod(m0 - f + win * k0, win) - k0
  if n < 0 then n = 0 end
  return n
end
if diff < win or (diff == win and nr == 0) then
  redis.call('HSET', KEYS[1], 't', int(ni), 'r', int(nr), 'l', ARGV[1], 'w', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil((diff + up) / 1000)))
  return {1, left(diff, nr), 0, diff + up}
end
local retry = diff - win + up
if retry < 1 then retry = 1 end
local reset = ti - now
if r > 0 then reset = reset + 1 end
return {0, left(ti - now, r), retry, reset}
