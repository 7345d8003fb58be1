-- Put before the scripts that remove waiters (acquire, release, leave, break): a script cannot
-- call another, so the one function they share is prepended to each (src/lock/mod.rs).
-- The waiters now in the first `window` places of `queue` whose expiry in `alive` is further than
-- `lifetime` ms from `now_ms` (they heartbeated from further back, less often) get it brought down
-- to that and are woken on their own channel, so that a live one heartbeats at once and a dead one
-- is dropped within that lifetime (docs/queue.md, "Liveness"). `except` (the caller, answering now,
-- or nil) is left alone.
local function clamp_front(queue, alive, window, now_ms, lifetime, prefix, except)
  for _, w in ipairs(redis.call('ZRANGE', queue, 0, window - 1)) do
    if w ~= except and redis.call('ZADD', alive, 'XX', 'LT', 'CH', now_ms + lifetime, w) == 1 then
      redis.call('PUBLISH', prefix .. '\031' .. w, 'front')
    end
  end
end
