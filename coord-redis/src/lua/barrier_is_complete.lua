-- Whether a barrier generation completed, keeping the state alive for
-- the grace while somebody waits. KEYS: as `barrier_arrive.lua`. ARGV: generation,
-- grace ms. Returns 1 (complete), 0 (open), or -1 when that generation's
-- state is gone (expired after the grace, or lost with the data).
local st = redis.call('HMGET', KEYS[1], 'gen', 'base')
local gen = tonumber(ARGV[1])
if not st[1] or gen < tonumber(st[2] or '0') then return -1 end
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
if gen < tonumber(st[1]) then return 1 end
return 0
