-- Compare-and-pexpire: extend the lock only where it still holds our token.
-- KEYS: the slot's key (the lock key for slot 1), fence counter, the slot's holder hash, limit,
--       and (optional) the token's renewal record (`release\x1frenewed.<token>`)
-- ARGV: token, ttl ms ('' = the grant's, recorded with the holder), fence T, the node's run id when
--       it last gave us the key ('' = never re-create), host, pid, command line, the ttl ms for ''
--       when the holder record is not ours (a canonical client's key has none), quarantine ms,
--       the grant's limit N ('' = the one recorded for the name) and slot ('' = unknown: only find
--       it), slot key base, holder hash base (slot i >= 2 is `base .. i`), the holder's note, the
--       wake channel prefix ('' = no probe: the renewals of a grant this run made, which probed),
--       the uptime ms above which the node was up already when it last had our key ('' = no
--       bound: the time since that call was sent, plus the node timeout), and the number of this
--       call among the holder's renewal calls ('' = not a held grant's renewal)
-- Returns the ttl ms set (renewed), {ttl ms set, run id} renewed for a holder that gave a run id
--         (the node's current run id, which the holder records), {ttl ms set, run id, mark} found
--         or put back where a renewal put it back (`back`, which the holder compares),
--         0 not ours, -1 not ours for now: the node restarted and is still in its restart quarantine.
--         With no slot given: the slots that hold the token here, as an array, and nothing renewed.
--
-- Finding first: a token can hold keys in two slots, its grant's and a stray on a node where its
-- round-1 request ran late and took another free slot. Only the slot with a quorum is the lease; the
-- client counts the slots found per slot and renews that one alone, so a stray never adds a vote and
-- is never extended.
--
-- Re-creation: when the key is missing and the node's run id is no longer the one it had when it gave
-- us the key, the node restarted since and lost our key in the restart, not to an operator, to
-- eviction or to expiry. It is put back only once the node is past its restart quarantine (the same
-- fail-closed rule as acquire.lua): by then every lease the node may have forgotten, another holder's
-- granted before a `break` included, has ended, so no grant the node forgot is still valid when
-- our key is back. Until then the node says "not ours" and counts against us, so a
-- holder that lost a majority this way loses its lease. The reply carries the new run id: the holder
-- records it, and a later disappearance on this node (a `break`, an eviction) is final. The fencing
-- counter, which the restart may have lost too, is raised to at least our token.
--
-- A key put back does not count until a renewal has counted without it after the holder learned of
-- it (the holder counts that node as "not ours" until then). Each put-back marks the key's holder
-- hash with a mark of its own (`back`: the call, the server's run id and time), and every renewal of
-- a held grant that finds the key answers with that mark: the holder learns of a put-back from its
-- reply, or from a later call that finds the key, if that reply was lost or the request reached the
-- node late (a call sent again, a request held up in the network and delivered after later renewals
-- had counted without the node). When the key was put back is not known, only that it was before
-- the holder learned of it. A copy of the call that runs again later makes a new mark.
-- The node
-- was without our key from its restart (or from whatever else removed it) until now, and the
-- quarantine covers only the first TTL of that time: past it, the node may have granted the lock to
-- another client, who may have released it since, leaving no trace. That client needed a quorum, so
-- the holder cannot have kept a quorum of keys all along; only the keys found in place show what it
-- kept. Counted, the key put back hid such a grant: a Redlock node out of reach from before its
-- restart to past its quarantine, and another node taken over by another server meanwhile, gave a
-- second client a quorum of two while the holder, renewing later, counted two of three again.
--
-- Nor does another server put our key back. A server now at the node's address (a replica promoted
-- by Sentinel or by hand, an address moved to another machine) has a new run id too, and may have
-- granted the lock since it took over. So nothing is put back by a server up since before the
-- holder's last call that found our key there (ARGV[16], which the holder measures from that call's
-- send, plus the node timeout), nor by a replica (`replica-read-only no`).
--
-- Slots: the limit key outlives every slot's lease, so a renewal that extends a slot extends it too.
local token, ttl = ARGV[1], ARGV[2]
-- The probe of the channel rights (acquire.lua): a renewal publishes nothing, but a holder that may
-- not publish could never release, so a `lockctl renew` of such a user is refused before it changes
-- anything.
if (ARGV[15] or '') ~= '' then
  if not redis.acl_check_cmd then
    redis.call('PUBLISH', ARGV[15] .. '\031', 'probe')
  elseif not redis.acl_check_cmd('PUBLISH', ARGV[15] .. '\031', 'probe') then
    error({err = 'NOPERM no permissions to access one of the channels, or to run PUBLISH'})
  end
end
local key, holder = KEYS[1], KEYS[3]
local limit = tonumber(ARGV[10])
local recorded = tonumber(redis.call('GET', KEYS[4]) or '')
if ARGV[11] == '' then
  local found = {}
  if redis.call('GET', key) == token then
    found[#found + 1] = 1
  end
  for i = 2, recorded or 1 do
    if redis.call('GET', ARGV[12] .. i) == token then
      found[#found + 1] = i
    end
  end
  return found
end
local current = redis.call('GET', key)
if ttl == '' then
  local h = redis.call('HMGET', holder, 'token', 'ttl_ms')
  ttl = (h[1] == token and h[2]) or ARGV[8]
end
-- The limit key is extended with the lease, never set to a value other than the one in use here: a
-- grant's limit differing from it belongs to another client's use of the name.
local function keep_limit()
  local n = recorded or limit
  if limit and recorded and limit ~= recorded then
    return
  end
  if n and n > 1 and redis.call('PTTL', KEYS[4]) < tonumber(ttl) then
    redis.call('SET', KEYS[4], n, 'PX', ttl)
  end
end
local granted_by = ARGV[4]
if current == token then
  redis.call('PEXPIRE', key, ttl)
  redis.call('PEXPIRE', holder, ttl)
  keep_limit()
  if granted_by == '' then
    return tonumber(ttl)
  end
  -- A holder that may re-create learns the run id under which the key is still there: after a
  -- restart that kept the key, a later disappearance (a `break`) is then final, not a restart loss.
  local now_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or granted_by
  -- The reply that tells it may be lost (a read cut by a stop of lockctl, a dropped connection),
  -- and the renewal sent again with the old run id: so the server keeps it too, for the lease's
  -- TTL. Without it, a break between the two sends was undone by the second one, which took the
  -- missing key for one lost in the restart and put it back.
  local back = (ARGV[17] or '') ~= '' and redis.call('HGET', holder, 'back')
  -- Kept as long as a key put back is there too: a copy of the call that put it back, delayed in
  -- the network, must not put it back again after a `break`.
  if KEYS[5] and (now_id ~= granted_by or back) then
    redis.call('SET', KEYS[5], now_id, 'PX', ttl)
  end
  if back then
    return {tonumber(ttl), now_id, back}
  end
  return {tonumber(ttl), now_id}
end
if current or granted_by == '' then
  return 0
end
local info = redis.call('INFO', 'server')
local run_id = string.match(info, 'run_id:(%x+)')
if not run_id or run_id == granted_by then
  return 0
end
-- This token's key was renewed here under the current run id, after the restart: gone since, it
-- was broken, evicted or expired, never lost in a restart (see the record above).
if KEYS[5] and redis.call('GET', KEYS[5]) == run_id then
  return 0
end
-- The name is in use here as a semaphore of another limit (of any, for a plain lock's holder): a key
-- put back would count in a semaphore of another size.
if limit and recorded and recorded ~= limit then
  return 0
end
local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
local up_before = tonumber(ARGV[16] or '')
-- Redis' uptime can read up to a second high (whole seconds of the clock, not of the time up).
if up_before and (not up or (up - 1) * 1000 > up_before) then
  return 0
end
if string.find(redis.call('INFO', 'replication'), 'role:slave', 1, true) then
  return 0
end
local quarantine = tonumber(ARGV[9])
if quarantine > 0 then
  if not up or (up - 1) * 1000 < quarantine then
    return -1
  end
end
redis.call('SET', key, token, 'NX', 'PX', ttl)
keep_limit()
local fence = redis.call('GET', KEYS[2]) or '0'
local t = ARGV[3]
if #fence < #t or (#fence == #t and fence < t) then
  redis.call('SET', KEYS[2], t)
end
local now = redis.call('TIME')
redis.call('HSET', holder, 'token', token, 'fence', t, 'host', ARGV[5], 'pid', ARGV[6],
  'cmd', ARGV[7], 'acquired_ms', now[1] * 1000 + math.floor(now[2] / 1000), 'ttl_ms', ttl,
  'slot', ARGV[11], 'limit', ARGV[10])
-- The mark is this run's own (the server's time in microseconds): a copy of the same call that runs
-- later (sent again, or delayed in the network) makes another mark, which the holder has not seen.
local back = (ARGV[17] or '') .. ':' .. run_id .. ':' .. now[1] .. '.' .. now[2]
redis.call('HSET', holder, 'back', back)
-- As a renewal under a new run id does (above): once put back here, a later disappearance is final.
if KEYS[5] then
  redis.call('SET', KEYS[5], run_id, 'PX', ttl)
end
-- The record the grant wrote, note included (acquire.lua writes it only when there is one).
if (ARGV[14] or '') ~= '' then
  redis.call('HSET', holder, 'note', ARGV[14])
end
redis.call('PEXPIRE', holder, ttl)
return {tonumber(ttl), run_id, back}
