-- Compare-and-pexpire: extend the lock only where it still holds our token.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, ttl ms, fence T, held ms, host, pid, command line
-- Returns 1 renewed, 2 re-created, 0 not ours.
--
-- Re-creation: when the key is missing and this node restarted after we took it (its uptime is shorter
-- than the time we have held the lock, with a second of margin for INFO's whole seconds), the node lost
-- our key in the restart, not to an operator or to expiry. The restart quarantine keeps other clients
-- from taking it there meanwhile, so we put our key back and raise the fencing counter, which the
-- restart may have lost too, to at least our token. held ms = 0 disables re-creation.
local token, ttl = ARGV[1], ARGV[2]
local current = redis.call('GET', KEYS[1])
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  return 1
end
local held = tonumber(ARGV[4])
if current or held <= 0 then
  return 0
end
local up = tonumber(string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)'))
if not up or (up + 1) * 1000 > held then
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
