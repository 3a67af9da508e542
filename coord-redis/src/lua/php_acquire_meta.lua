-- `php_acquire.lua` with holder metadata. ARGV: owner, ttl ms, stamp,
-- metadata.
local tail = '~' .. ARGV[1] .. '~' .. ARGV[4] .. '~'
