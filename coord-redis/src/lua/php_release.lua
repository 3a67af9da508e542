-- PHP layout: compare-and-delete, then publish a wake-up.
-- KEYS: claim, grant [, the owner's mark (see `mark` in scripts.rs)]. ARGV: owner,
-- channel, payload [, stamp, mark ttl ms].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
