-- PHP layout: compare-and-PEXPIRE (after `step` in scripts.rs). KEYS:
-- claim, grant, the owner's mark. ARGV: owner, ttl, stamp [, mark ttl ms].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
