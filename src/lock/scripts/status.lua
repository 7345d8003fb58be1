-- Everything `status` shows about one lock on one node, read atomically in one round trip.
-- KEYS: lock (slot 1), fence counter, holder hash (slot 1's), limit, queue, alive, waiters, seen
-- ARGV: slot key base, holder hash base (slot i >= 2 is `base .. i`), wake channel prefix, a waiter's
--       lifetime at the front of the queue in ms (the caller's slack counted)
-- Returns {token or false, pttl, fence or false, {holder field, value, ...}, {server seconds, micros},
--          uptime in seconds or false, the limit or false,
--          {{slot, token, pttl, {holder field, value, ...}}, ...} for the held slots from 2 on,
--          {waiter id, record (JSON), ticket, ...} the live waiters in queue order}
-- Read only: waiters whose heartbeat expired are left out, not removed. So is a waiter behind the
-- front of the queue (an expiry further away than a front lifetime: it heartbeats seconds apart)
-- that no longer listens on its wake channel: a process's subscription ends with it, so one that
-- died stops being listed at once, although its entry stays until it reaches the front (acquire.lua
-- brings its expiry down there) or its expiry passes. A waiter whose expiry passed since the last
-- script that looked at the queue (`seen`: this node may have stalled) is shown as the next script
-- will keep it (front.lua, keep_time, moved_expiry): moved to a front lifetime from now, once, if it still
-- listens and no script ran here within two of its front heartbeats before that expiry.
local up = string.match(redis.call('INFO', 'server'), 'uptime_in_seconds:(%d+)')
local limit = tonumber(redis.call('GET', KEYS[4]) or '')
local slots = {}
for i = 2, limit or 1 do
  local token = redis.call('GET', ARGV[1] .. i)
  if token then
    slots[#slots + 1] = {i, token, redis.call('PTTL', ARGV[1] .. i),
      redis.call('HGETALL', ARGV[2] .. i)}
  end
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local lifetime = tonumber(ARGV[4])
local last = tonumber(redis.call('GET', KEYS[8]) or '')
local waiters = {}
local queue = redis.call('ZRANGE', KEYS[5], 0, -1, 'WITHSCORES')
for i = 1, #queue, 2 do
  local expiry = tonumber(redis.call('ZSCORE', KEYS[6], queue[i]))
  local listed = expiry and expiry > now_ms
  if not listed and expiry and last and expiry > last then
    local moved = moved_expiry(KEYS[7], queue[i], expiry, last, now_ms, lifetime, ARGV[3])
    if moved then
      listed, expiry = true, moved
    end
  end
  if listed and expiry > now_ms + lifetime then
    listed = listens(ARGV[3], queue[i])
  end
  if listed then
    table.insert(waiters, queue[i])
    table.insert(waiters, redis.call('HGET', KEYS[7], queue[i]) or '{}')
    table.insert(waiters, queue[i + 1])
  end
end
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]),
  redis.call('HGETALL', KEYS[3]), t, tonumber(up) or false, limit or false, slots, waiters}
