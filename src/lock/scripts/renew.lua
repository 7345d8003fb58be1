-- Compare-and-pexpire: extend the lock only where it still holds our token.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, ttl ms ('' = the grant's, recorded with the holder), fence T, the node's run id when
--       we won it ('' = never re-create), host, pid, command line, the ttl ms for '' when the holder
--       record is not ours (a canonical client's key has none)
-- Returns the ttl ms set (renewed or re-created), 0 not ours.
--
-- Re-creation: when the key is missing and the node's run id is no longer the one it had when it
-- granted us the lock, the node restarted since and lost our key in the restart, not to an operator,
-- to eviction or to expiry. The restart quarantine keeps other clients from taking it there meanwhile,
-- so we put our key back and raise the fencing counter, which the restart may have lost too, to at
-- least our token.
local token, ttl = ARGV[1], ARGV[2]
if ttl == '' then
  local h = redis.call('HMGET', KEYS[3], 'token', 'ttl_ms')
  ttl = (h[1] == token and h[2]) or ARGV[8]
end
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  return tonumber(ttl)
end
local granted_by = ARGV[4]
if current or granted_by == '' then
  return 0
end
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not run_id or run_id == granted_by then
  return 0
end
redis.call('SET', KEYS[1], token, 'NX', 'PX', ttl)
local fence = redis.call('GET', KEYS[2]) or '0'
local t = ARGV[3]
if #fence < #t or (#fence == #t and fence < t) then
  redis.call('SET', KEYS[2], t)
end
local now = redis.call('TIME')
redis.call('HSET', KEYS[3], 'token', token, 'fence', t, 'host', ARGV[5], 'pid', ARGV[6],
  'cmd', ARGV[7], 'acquired_ms', now[1] * 1000 + math.floor(now[2] / 1000), 'ttl_ms', ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return tonumber(ttl)
