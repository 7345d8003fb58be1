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
    if w ~= except and redis.call('ZADD', alive, 'XX', 'LT', 'CH', until_ms, w) == 1 then
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
-- last script that looked at the queue, with the queue's TTL. While waiters are queued the front
-- heartbeats every second, so a gap longer than a front `lifetime` means that this node did not run
-- (or nobody could reach it): the waiters' expiries passed without their fault. Then every expiry
-- moves forward by the gap, as if the node's clock had stood still, except for the expired waiters
-- that no longer listen on their wake channel (they died: their connection closed). O(1) calls
-- otherwise. A gap after a shift that no heartbeat followed is no stall (the `s` mark): the waiters
-- that did not beat since are dead or stopped and are dropped as usual. `beat`: the caller is a
-- queued waiter's attempt. Returns the gap when the expiries moved (0 otherwise).
local function keep_time(queue, alive, seen, now_ms, lifetime, prefix, beat)
  local last, mark = string.match(redis.call('GET', seen) or '', '^(%d+)(s?)$')
  local gap = last and now_ms - tonumber(last) or 0
  if gap > lifetime and mark == '' and redis.call('ZCARD', alive) > 0 then
    local all = redis.call('ZRANGE', alive, 0, -1, 'WITHSCORES')
    for i = 1, #all, 2 do
      local expiry = tonumber(all[i + 1])
      if expiry > now_ms or listens(prefix, all[i]) then
        redis.call('ZADD', alive, 'XX', expiry + gap, all[i])
      end
    end
    mark = 's'
  else
    gap = 0
  end
  local keep = redis.call('PTTL', queue)
  if keep > 0 then
    redis.call('SET', seen, now_ms .. (beat and '' or mark or ''), 'PX', keep)
  end
  return gap
end
