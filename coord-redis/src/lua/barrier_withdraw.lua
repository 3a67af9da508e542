-- Withdraw one arrival from a barrier generation. KEYS: as
-- `barrier_arrive.lua`. ARGV: generation, participant, arrival id, grace ms.
-- Returns 0 if that generation completed (the participant passed), else 1:
-- the arrival no longer counts. Only that arrival id goes (the
-- participant stays while another of its arrivals, a next wait, is in),
-- and it is kept as a tombstone until the open generation completes, so a
-- late copy of it is refused; its stamp joins the participant's newest
-- (`a:<participant>`, as a passed arrival's does), so a copy landing after
-- that is refused too. A generation older than the state (`base`:
-- the state expired or was lost since) has nothing to withdraw; the
-- tombstone still goes into the state there is, made anew if gone.
local st = redis.call('HMGET', KEYS[1], 'gen', 'base')
local gen = tonumber(ARGV[1])
local cur = tonumber(st[1])
if not cur then
  local t = redis.call('TIME')
  cur = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('HSET', KEYS[1], 'base', string.format('%.0f', cur),
    'gen', string.format('%.0f', cur))
elseif gen >= tonumber(st[2] or '0') and gen < cur then
  return 0
end
local who = redis.call('HGET', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[3], '')
if who and who ~= '' then
  local all = redis.call('HVALS', KEYS[3])
  local still = false
  for _, p in ipairs(all) do
    if p == who then still = true end
  end
  if not still then redis.call('SREM', KEYS[2], who) end
end
local f, t = 'a:' .. ARGV[2], tonumber(string.sub(ARGV[3], 1, 16), 16)
if t > tonumber(redis.call('HGET', KEYS[1], f) or '0') then
  redis.call('HSET', KEYS[1], f, string.format('%.0f', t))
end
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ARGV[4]) end
return 1
