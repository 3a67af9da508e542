-- The rest of a PHP-layout acquire: a new grant writes `tail` after its
-- token; a retry by the holder keeps its grant (and metadata) as it is,
-- and its answer says so (a third item, 1; 0 when its grant key was gone
-- and it got a new token).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local tok = issue(KEYS[3])
  redis.call('SET', KEYS[2], tok .. tail, 'PX', ARGV[2])
  return {1, tok}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local g = redis.call('GET', KEYS[2])
  local tok = g and string.match(g, '^%d+')
  local again = 1
  if tok then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  else
    -- The grant key is gone: a new grant, with a new token.
    again = 0
    tok = issue(KEYS[3])
    redis.call('SET', KEYS[2], tok .. tail, 'PX', ARGV[2])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tok, again}
end
return {0, redis.call('PTTL', KEYS[1])}
