-- Compare-and-delete: remove the lock only where it still holds our token, then wake whom the
-- release lets in: the first live waiters of the queue, as many as there are free slots (waiters
-- whose heartbeat expired are dropped first), each on its own channel. The release channel is still
-- announced for older clients.
-- KEYS: lock (slot 1), holder hash (slot 1's), limit, queue, alive, waiters, seen, and (optional)
--       the record of this token's release (of a rollback: its tombstone, see below)
-- ARGV: token, release channel, slot key base, holder hash base (slot i >= 2 is `base .. i`), wake
--       channel prefix, a waiter's lifetime at the front of the queue in ms (the caller's slack
--       counted), '1' for the rollback of a grant that lost (optional): the waiter goes back to the
--       place in the queue its grant took it from (the holder record keeps it, `queued`); the
--       record's lifetime in ms (optional, with KEYS[8]), this release call's own random id
--       (optional, with KEYS[8]; the same on its resend; empty for a rollback)
-- Returns the slots whose key held our token and was deleted (empty: not ours; expired, broken, taken).
-- The token is looked for in every slot of the limit recorded for the name (slot 1 alone without
-- one), so a release needs no slot number. Every key of the token goes: besides its grant's slot it
-- may hold a stray in another (a round-1 request that ran late here), which is the caller's too. The
-- client judges the release by the slot with a quorum. Once no slot is held the limit is forgotten.
-- A release that deleted something records which slots, with the id of the call that did, for a
-- little longer than the client waits for the reply: the client sends a release again when the
-- connection drops before the reply, and the second send finds the first one's deletion; the record
-- (set by the first send, in this server's data) answers it as the first send did (see node.rs).
-- Only a record with the call's own id counts: the token alone cannot tell this call's first send
-- from an earlier release of the same token (`lockctl release --token T` run twice), whose record
-- must not make a token that holds nothing any more look released. No send needs to say it is a
-- resend: a first send finds no record with its id, since only a send of the same call writes one.
-- Nothing but a send of this call that ran here leaves it, so a key lost with a restart, broken, or
-- expired is still "not ours".
-- A rollback with KEYS[8] is one to a node where the attempt timed out ('1', the record's lifetime in
-- ms, an empty id): the attempt may still be in this server's sockets, and run after this rollback
-- (sent on a new connection too, node.rs). Its record (`:` when nothing was deleted, else the
-- slots deleted) is the attempt's tombstone: acquire.lua finds it and does nothing. Its id is
-- empty, which no release call has, so a release sent again never reads it as its own. It is
-- written after a delete: a server over its maxmemory (noeviction) refuses a script's first write
-- that adds memory, and aborts the script, whereas a delete first is allowed and lets the writes
-- after it through.
-- The probe of the channel rights (acquire.lua) comes before the first write, since a script is
-- not rolled back when a command in it is refused: a caller without the channel rules changes
-- nothing. Every other PUBLISH is a pcall, so no refusal can come after a write: a channel the
-- caller's rules happen not to cover (the announcement on `released`, which only outside listeners
-- use; one waiter's wake channel) goes unsent, and a waiter not woken retries at its heartbeat.
local token = ARGV[1]
if not redis.acl_check_cmd then
  redis.call('PUBLISH', ARGV[5] .. '\031', 'probe')
elseif not redis.acl_check_cmd('PUBLISH', ARGV[5] .. '\031', 'probe') then
  error({err = 'NOPERM no permissions to access one of the channels, or to run PUBLISH'})
end
local n = tonumber(redis.call('GET', KEYS[3]) or '')
local deleted = {}
local places = {}
local function take(key, holder)
  if ARGV[7] == '1' then
    places[#places + 1] = redis.call('HGET', holder, 'queued')
  end
  redis.call('DEL', key, holder)
end
if redis.call('GET', KEYS[1]) == token then
  take(KEYS[1], KEYS[2])
  deleted[1] = 1
end
for i = 2, n or 1 do
  if redis.call('GET', ARGV[3] .. i) == token then
    take(ARGV[3] .. i, ARGV[4] .. i)
    deleted[#deleted + 1] = i
  end
end
if #deleted == 0 then
  if ARGV[7] == '1' and KEYS[8] then
    -- A delete first: a server over its maxmemory lets the writes of a script that has written
    -- through, as it lets the late attempt's (acquire.lua's first write is of that kind).
    redis.call('DEL', KEYS[8])
    redis.call('SET', KEYS[8], ':', 'PX', ARGV[8])
    return deleted
  end
  if KEYS[8] then
    local done = redis.call('GET', KEYS[8])
    local id, slots = string.match(done or '', '^([^:]*):(.*)$')
    if id and id ~= '' and id == ARGV[9] then
      for s in string.gmatch(slots, '%d+') do
        deleted[#deleted + 1] = tonumber(s)
      end
    end
  end
  return deleted
end
if tonumber(ARGV[8] or '') then
  redis.call('SET', KEYS[8], (ARGV[9] or '') .. ':' .. table.concat(deleted, ','), 'PX', ARGV[8])
end
redis.pcall('PUBLISH', ARGV[2], 'released')
-- free: the number of free slots.
local free = 0
for i = 1, n or 1 do
  if not redis.call('GET', i == 1 and KEYS[1] or ARGV[3] .. i) then
    free = free + 1
  end
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
for _, p in ipairs(places) do
  -- A rolled-back grant: the waiter is still waiting, at the place it had (it stays queued only as
  -- long as its last heartbeat allows, since this call does not prove it alive).
  local ok, w = pcall(cjson.decode, p)
  if ok and type(w) == 'table' and w.id and w.ticket and w.alive and w.rec then
    redis.call('ZADD', KEYS[4], 'NX', w.ticket, w.id)
    redis.call('ZADD', KEYS[5], 'NX', w.alive, w.id)
    redis.call('HSETNX', KEYS[6], w.id, w.rec)
    local keep = math.max(tonumber(w.alive) - now_ms, 0) + tonumber(ARGV[6])
    for _, k in ipairs({KEYS[4], KEYS[5], KEYS[6]}) do
      if redis.call('PTTL', k) < keep then
        redis.call('PEXPIRE', k, keep)
      end
    end
  end
end
keep_time(KEYS[4], KEYS[5], KEYS[6], KEYS[7], now_ms, tonumber(ARGV[6]), ARGV[5])
local dead = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms)
if #dead > 0 then
  redis.call('ZREM', KEYS[4], unpack(dead))
  redis.call('ZREM', KEYS[5], unpack(dead))
  redis.call('HDEL', KEYS[6], unpack(dead))
  if redis.call('ZCARD', KEYS[4]) == 0 then
    -- Nobody waits any more: `seen` goes now, not at the end of the keys' floor (acquire.lua).
    redis.call('DEL', KEYS[7])
  end
  clamp_front(KEYS[4], KEYS[5], KEYS[6], (n or 1) + 1, now_ms, tonumber(ARGV[6]), ARGV[5])
end
-- Once no slot is held and nobody waits (the dead dropped above included), the limit is forgotten.
if n and free == n and redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[3])
end
for _, w in ipairs(redis.call('ZRANGE', KEYS[4], 0, free - 1)) do
  redis.pcall('PUBLISH', ARGV[5] .. '\031' .. w, 'released')
end
return deleted
