-- Shared by every limiter script: the server clock and the quota, and
-- exact integer helpers. Every number here is a non-negative integer below
-- 2^53 (exact in a Lua double); the backend refuses limits and windows of
-- 2^49 or more, so products are done in decimal digits where they could
-- exceed 2^53.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local win = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

-- floor(a / b) and a mod b, exactly (a < 2^53, 0 < b < 2^53).
local function divmod(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q, a - q * b
end

-- Decimal digit arrays, least significant first.
local function big(n)
  local d = {}
  repeat
    local q, r = divmod(n, 10)
    d[#d + 1] = r
    n = q
  until n == 0
  return d
end

-- a * m + add, for m, add < 2^49.
local function bigmul(a, m, add)
  local out, carry = {}, add or 0
  for i = 1, #a do
    local q, r = divmod(a[i] * m + carry, 10)
    out[i] = r
    carry = q
  end
  while carry > 0 do
    local q, r = divmod(carry, 10)
    out[#out + 1] = r
    carry = q
  end
  return out
end

-- floor(a / m) and a mod m, for 0 < m < 2^49. The quotient is returned as
-- a number, capped at 2^52 (callers only ever need it when it is small;
-- the cap is far beyond any window).
local function bigdiv(a, m)
  local q, rem = 0, 0
  local cap = 4503599627370496
  for i = #a, 1, -1 do
    local d
    d, rem = divmod(rem * 10 + a[i], m)
    if q < cap then q = q * 10 + d end
  end
  if q > cap then q = cap end
  return q, rem
end

-- floor(a * b / c) and (a * b) mod c, for a < 2^53, b and c < 2^49.
-- A product below 2^53 is exact in a double (and a rounded one is never
-- below it), so the usual case needs no digit arrays.
local function muldiv(a, b, c)
  local p = a * b
  if p < 9007199254740992 then return divmod(p, c) end
  return bigdiv(bigmul(big(a), b), c)
end

-- Exact integers as strings (tostring keeps only 14 digits).
local function int(n)
  return string.format('%.0f', n)
end
