-- Stats. ARGV: channel, name. Returns {ready, delayed, in flight, dead}:
-- the main lane's messages by state (a lapsed delivery or a delay that
-- ended counts as ready) and every dead letter. Changes nothing.
local L = LANES[0]
local total = redis.call('ZCARD', L.I)
local after = '(' .. now
local flight = redis.call('ZCOUNT', L.TF, after, '+inf')
local delayed = redis.call('ZCOUNT', L.TD, after, '+inf')
local ready = total - flight - delayed
if ready < 0 then ready = 0 end
return {ready, delayed, flight, redis.call('ZCARD', LANES[1].I)}
