-- Put before the scripts that read and change the queue (acquire, release, leave, break): a script
-- cannot call another, so the functions they share are prepended to each (src/lock/mod.rs).
-- The waiters now in the first `window` places of `queue` whose expiry in `alive` is further than
-- their front lifetime from `now_ms` (they heartbeated from further back, less often) get it brought
-- down to that and are woken on their own channel, so that a live one heartbeats at once and a dead
-- one is dropped within that lifetime (docs/queue.md, "Liveness"). The front lifetime is the
-- caller's `lifetime` or the one the waiter's record keeps (`front`: its own node timeout counted),
-- whichever is longer. `except` (the caller, answering now, or nil) is left alone.
local function clamp_front(queue, alive, waiters, window, now_ms, lifetime, prefix, except)
  for _, w in ipairs(redis.call('ZRANGE', queue, 0, window - 1)) do
    local ok, rec = pcall(cjson.decode, redis.call('HGET', waiters, w) or '')
    local own = ok and type(rec) == 'table' and tonumber(rec.front) or 0
    local until_ms = now_ms + math.max(lifetime, own)
    local expiry = tonumber(redis.call('ZSCORE', alive, w))
    if w ~= except and expiry and expiry > until_ms then
      -- An expiry moved after a stall keeps its mark (keep_time).
      redis.call('ZADD', alive, 'XX', string.format('%.1f', until_ms + expiry % 1), w)
      redis.call('PUBLISH', prefix .. '\031' .. w, 'front')
    end
  end
end
-- True when waiter `w` listens on its wake channel here (an ACL user without `+pubsub|numsub`
-- cannot ask: then it counts as listening).
local function listens(prefix, w)
  local subs = redis.pcall('PUBSUB', 'NUMSUB', prefix .. '\031' .. w)
  return type(subs) ~= 'table' or subs.err ~= nil or subs[2] > 0
end
-- The node's own stall (SIGSTOP of the server, a paused VM): `seen` keeps the server time of the
-- last script that looked at the queue, with the queue's TTL. A waiter whose expiry passed since then
-- may have been kept from beating by this node, not by its own death: nothing ran here to hear it.
-- Its expiry moves forward by the gap, as if the node's clock had stood still, once: the moved score
-- ends in half a millisecond, the mark, which its next heartbeat clears (an expiry that passes again
-- unbeaten is the waiter's own). A waiter that no longer listens on its wake channel is not moved:
-- its connection closed, it died. So a stall shorter than the queue keys' TTL keeps the live
-- waiters, and a waiter that is stopped or dead is dropped at most one gap later than its expiry
-- (docs/queue.md, "A node that stalls"). Costs O(log N) calls, and one more for each waiter whose
-- expiry passed.
local function keep_time(queue, alive, seen, now_ms, prefix)
  local last = tonumber(redis.call('GET', seen) or '')
  if last and now_ms > last then
    local gap = now_ms - last
    local due = redis.call('ZRANGEBYSCORE', alive, '(' .. last, now_ms, 'WITHSCORES')
    for i = 1, #due, 2 do
      local expiry = tonumber(due[i + 1])
      if expiry % 1 == 0 and listens(prefix, due[i]) then
        redis.call('ZADD', alive, 'XX', string.format('%.1f', expiry + gap + 0.5), due[i])
      end
    end
  end
  local keep = redis.call('PTTL', queue)
  if keep > 0 then
    redis.call('SET', seen, now_ms, 'PX', keep)
  end
end
