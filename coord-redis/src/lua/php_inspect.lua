-- PHP layout: who holds a lock (read only). KEYS: claim, grant.
-- Returns `{}` when free, else `{owner, token, pttl}` (token `''` when
-- the holder has no grant key: a PHP holder), with the metadata as a
-- fourth item when the grant carries some.
local o = redis.call('GET', KEYS[1])
if not o then return {} end
local out = {o, '', redis.call('PTTL', KEYS[1])}
local g = redis.call('GET', KEYS[2])
local tok = g and string.match(g, '^%d+')
if not tok then return out end
local rest = string.sub(g, #tok + 1)
if rest == '' then
  out[2] = tok
elseif string.sub(rest, 1, #o + 2) == '~' .. o .. '~' and #rest >= #o + 3
  and string.byte(rest, -1) == 126 then
  out[2] = tok
  out[4] = string.sub(rest, #o + 3, -2)
end
return out
