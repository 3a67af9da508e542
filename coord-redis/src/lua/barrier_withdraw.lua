-- Withdraw from a barrier generation. KEYS: as `barrier_arrive.lua`.
-- ARGV: generation, participant. Returns 0 if that generation completed
-- (1 when it is still open, or its state is gone: nothing to withdraw).
local st = redis.call('HMGET', KEYS[1], 'gen', 'base')
local gen = tonumber(ARGV[1])
if not st[1] or gen < tonumber(st[2] or '0') then return 1 end
local cur = tonumber(st[1])
if gen < cur then return 0 end
if gen == cur then
  redis.call('SREM', KEYS[2], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
end
return 1
