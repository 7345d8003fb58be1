-- A waiter stops waiting (granted elsewhere, its -w deadline, a signal): it leaves the queue at once,
-- and if it stood where a free slot would let it in, the waiter that takes its place is woken.
-- KEYS: lock (slot 1), queue, alive, waiters, tickets, limit, seen
-- ARGV: waiter id, wake channel prefix, slot key base (slot i >= 2 is `base .. i`), a waiter's
--       lifetime at the front of the queue in ms (the caller's slack counted)
-- Returns 1 when the waiter was queued here, 0 when it was not.
local rank = redis.call('ZRANK', KEYS[2], ARGV[1])
if not rank then
  return 0
end
-- No probe of the channel rights (acquire.lua): leaving is never refused, also by a waiter whose
-- rules were taken away while it waited (its attempt was refused, and it leaves). A wake the ACL
-- refuses (pcall) is not sent: the waiter it was for retries at its heartbeat.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
if redis.call('ZCARD', KEYS[2]) == 0 then
  -- The last one out takes the queue's keys along, and the limit too when no slot is held.
  redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[7])
  local n = tonumber(redis.call('GET', KEYS[6]) or '')
  local held = false
  for i = 1, n or 0 do
    held = held or redis.call('GET', i == 1 and KEYS[1] or ARGV[3] .. i)
  end
  if n and not held then
    redis.call('DEL', KEYS[6])
  end
  return 1
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
-- Nobody is dropped here, but the time is kept: after a stall the expiries move first (front.lua).
keep_time(KEYS[2], KEYS[3], KEYS[4], KEYS[7], now_ms, tonumber(ARGV[4]), ARGV[2])
local limit = tonumber(redis.call('GET', KEYS[6]) or '') or 1
if rank <= limit then
  clamp_front(KEYS[2], KEYS[3], KEYS[4], limit + 1, now_ms, tonumber(ARGV[4]), ARGV[2])
end
-- free: the number of free slots.
local free = 0
for i = 1, limit do
  if not redis.call('GET', i == 1 and KEYS[1] or ARGV[3] .. i) then
    free = free + 1
  end
end
if rank < free then
  for _, w in ipairs(redis.call('ZRANGE', KEYS[2], 0, free - 1)) do
    redis.pcall('PUBLISH', ARGV[2] .. '\031' .. w, 'head')
  end
end
return 1
