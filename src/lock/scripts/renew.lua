-- Compare-and-pexpire: extend the lock only where it still holds our token.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, ttl ms, fence T, the node's run id when we won it ('' = never re-create), host, pid,
--       command line
-- Returns 1 renewed, 2 re-created, 0 not ours.
--
-- Re-creation: when the key is missing and the node's run id is no longer the one it had when it
-- granted us the lock, the node restarted since and lost our key in the restart, not to an operator,
-- to eviction or to expiry. The restart quarantine keeps other clients from taking it there meanwhile,
-- so we put our key back and raise the fencing counter, which the restart may have lost too, to at
-- least our token.
local token, ttl = ARGV[1], ARGV[2]
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  return 1
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
  'cmd', ARGV[7], 'acquired_ms', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('PEXPIRE', KEYS[3], ttl)
return 2
