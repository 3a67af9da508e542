-- Inspect (read only). ARGV: channel, name. Returns {waiters, holder...}:
-- the queue places that have not lapsed, then each live grant (expiry
-- above the server clock, with its permits and token) as
-- {owner, permits, token, ms left[, metadata]}. A grant whose parts
-- disagree (one key lost: `repair` would drop it) is not shown.
local out = {redis.call('ZCOUNT', QE, '(' .. fmt(now_ms), '+inf')}
local live = redis.call('ZRANGEBYSCORE', GE, '(' .. fmt(now_ms), '+inf', 'WITHSCORES')
for j = 1, #live, 2 do
  local g = redis.call('HGET', GI, live[j])
  local p, tok = nil, nil
  if g then p, tok = string.match(g, '^(%d+):(%d+)') end
  if tok then
    local h = {live[j], p, tok, fmt(tonumber(live[j + 1]) - now_ms)}
    if string.byte(g, #p + #tok + 2) == 58 then h[5] = string.sub(g, #p + #tok + 3) end
    out[#out + 1] = h
  end
end
return out
