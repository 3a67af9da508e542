-- Redrive. ARGV: channel, name, limit. Moves up to `limit` dead letters
-- that are not in flight (lowest id first) to the main lane, ready at once
-- with attempts 0, and wakes every waiter of the main lane. Returns how
-- many moved.
local DL, ML = LANES[1], LANES[0]
advance(DL)
local limit, moved, kept = tonumber(ARGV[3]), 0, 0
while moved < limit do
  local ids = redis.call('ZRANGE', DL.I, kept, kept + 99)
  if #ids == 0 then break end
  for _, id in ipairs(ids) do
    if moved >= limit then break end
    local m = getmeta(DL, id)
    if not m then
      redis.call('ZREM', DL.I, id)
    elseif m.owner ~= '' and tonumber(m.at) > now_us then
      kept = kept + 1
    else
      remove(DL, id, m)
      m.attempts, m.at, m.owner = 0, '', ''
      insert(ML, id, m)
      moved = moved + 1
    end
  end
end
if moved > 0 then wake(ML, true) end
return moved
