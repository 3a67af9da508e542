-- Peek. ARGV: channel, name, lane, limit. Returns the lane's first `limit`
-- messages by id, whatever their state, five items each: id, attempts,
-- enqueued ms, group, payload. Changes nothing.
local L = LANES[tonumber(ARGV[3])]
local out = {}
for _, id in ipairs(redis.call('ZRANGE', L.I, 0, tonumber(ARGV[4]) - 1)) do
  local m = getmeta(L, id)
  local body = redis.call('HGET', B, id)
  if m and body then
    out[#out + 1] = id
    out[#out + 1] = m.attempts
    out[#out + 1] = m.enq
    out[#out + 1] = m.group
    out[#out + 1] = body
  end
end
return out
