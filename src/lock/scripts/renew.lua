-- Compare-and-pexpire: extend the lock only where it still holds our token.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, ttl ms ('' = the grant's, recorded with the holder), fence T, the node's run id when
--       it last gave us the key ('' = never re-create), host, pid, command line, the ttl ms for ''
--       when the holder record is not ours (a canonical client's key has none), quarantine ms
-- Returns the ttl ms set (renewed), {ttl ms set, run id} renewed or re-created for a holder that
--         gave a run id (the node's current run id, which the holder records),
--         0 not ours, -1 not ours for now: the node restarted and is still in its restart quarantine.
--
-- Re-creation: when the key is missing and the node's run id is no longer the one it had when it gave
-- us the key, the node restarted since and lost our key in the restart, not to an operator, to
-- eviction or to expiry. It is put back only once the node is past its restart quarantine (the same
-- fail-closed rule as acquire.lua): by then every lease the node may have forgotten, another holder's
-- granted before a `break` included, has ended, so the key we put back cannot give us a quorum while
-- another grant may still be valid. Until then the node says "not ours" and counts against us, so a
-- holder that lost a majority this way loses its lease. The reply carries the new run id: the holder
-- records it, and a later disappearance on this node (a `break`, an eviction) is final. The fencing
-- counter, which the restart may have lost too, is raised to at least our token.
local token, ttl = ARGV[1], ARGV[2]
if ttl == '' then
  local h = redis.call('HMGET', KEYS[3], 'token', 'ttl_ms')
  ttl = (h[1] == token and h[2]) or ARGV[8]
end
local current = redis.call('GET', KEYS[1])
local granted_by = ARGV[4]
if current == token then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  if granted_by == '' then
    return tonumber(ttl)
  end
  -- A holder that may re-create learns the run id under which the key is still there: after a
  -- restart that kept the key, a later disappearance (a `break`) is then final, not a restart loss.
  return {tonumber(ttl), string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or granted_by}
end
if current or granted_by == '' then
  return 0
end
local info = redis.call('INFO', 'server')
local run_id = string.match(info, 'run_id:(%x+)')
if not run_id or run_id == granted_by then
  return 0
end
local quarantine = tonumber(ARGV[9])
if quarantine > 0 then
  local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
  if not up or (up - 1) * 1000 < quarantine then
    return -1
  end
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
return {tonumber(ttl), run_id}
