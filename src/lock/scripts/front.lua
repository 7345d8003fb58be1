-- Put before the scripts that read and change the queue (acquire, release, leave, break) and before
-- status, which shows it as they will leave it: a script cannot call another, so the functions they
-- share are prepended to each (src/lock/mod.rs).
-- The waiters now in the first `window` places of `queue` whose expiry in `alive` is further than
-- their front lifetime from `now_ms` (they heartbeated from further back, less often) get it brought
-- down to that and are woken on their own channel, so that a live one heartbeats at once and a dead
-- one is dropped within that lifetime (docs/queue.md, "Liveness"). The front lifetime is the one
-- the waiter's record keeps (`front`: its own node timeout counted), or the caller's `lifetime` for
-- a record without it (an older client): not the longer of the two, or a caller with a long node
-- timeout would keep a stopped waiter ahead of it for its own lifetime. `except` (the caller, answering now, or nil) is left alone. A woken waiter's
-- score ends in a quarter of a millisecond until its own heartbeat makes it whole again: it is
-- pending, and the waiters behind it are told to beat at the front's pace meanwhile (pending_ahead).
local function clamp_front(queue, alive, waiters, window, now_ms, lifetime, prefix, except)
  for _, w in ipairs(redis.call('ZRANGE', queue, 0, window - 1)) do
    local ok, rec = pcall(cjson.decode, redis.call('HGET', waiters, w) or '')
    local own = ok and type(rec) == 'table' and tonumber(rec.front) or lifetime
    local until_ms = now_ms + own
    local expiry = tonumber(redis.call('ZSCORE', alive, w))
    if w ~= except and expiry and expiry > until_ms then
      -- Brought down only when the wake went out: a caller whose ACL does not cover this waiter's
      -- channel cannot wake it (a refused PUBLISH, docs/security.md), and a waiter not woken beats
      -- at its own slower pace, so it would be dropped alive. Subscribers get the message only
      -- after the script, so the order of the two lines is invisible.
      local sent = redis.pcall('PUBLISH', prefix .. '\031' .. w, 'front')
      if not (type(sent) == 'table' and sent.err) then
        -- An expiry moved after a stall keeps its mark (keep_time).
        local mark = expiry % 1 == 0.5 and 0.5 or 0.25
        redis.call('ZADD', alive, 'XX', string.format('%.2f', until_ms + mark), w)
      end
    end
  end
end
-- True when one of the first `window` waiters, among the `ahead` queued before the caller, is
-- pending: woken to the front or moved after a stall (its score has a fraction) and not heard from
-- since. The caller then heartbeats at the front's pace, so that a script runs here when that
-- expiry passes, and a stopped waiter is dropped then, not at the caller's next rare heartbeat.
local function pending_ahead(queue, alive, window, ahead)
  for _, w in ipairs(redis.call('ZRANGE', queue, 0, math.min(window, ahead) - 1)) do
    local expiry = tonumber(redis.call('ZSCORE', alive, w))
    if expiry and expiry % 1 ~= 0 then
      return true
    end
  end
  return false
end
-- True when waiter `w` listens on its wake channel here (an ACL user without `+pubsub|numsub`
-- cannot ask: then it counts as listening).
local function listens(prefix, w)
  local subs = redis.pcall('PUBSUB', 'NUMSUB', prefix .. '\031' .. w)
  return type(subs) ~= 'table' or subs.err ~= nil or subs[2] > 0
end
-- Where waiter `w`, whose expiry passed since this node's last look at the queue (`last`), stands
-- after what may have been a stall of the node (keep_time, below): a front lifetime from now, or
-- nil when it is to be dropped.
local function moved_expiry(waiters, w, expiry, last, now_ms, lifetime, prefix)
  local ok, rec = pcall(cjson.decode, redis.call('HGET', waiters, w) or '')
  rec = ok and type(rec) == 'table' and rec or {}
  local beat = tonumber(rec.beat)
  local could_hear = beat and last >= expiry - 2 * beat
  if expiry % 1 ~= 0.5 and not could_hear and (rec.sub ~= true or listens(prefix, w)) then
    return now_ms + (tonumber(rec.front) or lifetime)
  end
  return nil
end
-- The node's own stall (SIGSTOP of the server, a paused VM): `seen` keeps the server time of the
-- last script that looked at the queue, with the queue's TTL. A waiter whose expiry passed since then
-- may have been kept from beating by this node, not by its own death: nothing ran here to hear it.
-- Unless a script ran here within two of its front heartbeats (`beat` in its record) before that
-- expiry: its next heartbeat was due by then (an expiry is three intervals and the slack after the
-- last one), and a node that ran a script at or after that time was up to take it, or ran it at its
-- resume, where it had waited in the socket. Otherwise its expiry moves to a front lifetime from now,
-- once, and it is woken (`moved`), so that a live one beats at once: the moved score ends in half a
-- millisecond, the mark, which its next heartbeat clears (an expiry that passes again unbeaten is the
-- waiter's own). A waiter that no longer listens on its wake channel, where its last attempt said
-- it did (`sub` in its record, acquire.lua; a first enqueue counts as saying so), is not moved: its
-- connection closed, it died. One whose last attempt said it did not is moved all the same: a
-- waiter whose subscription had failed (it tries again every 5 s) lives and listens nowhere, and
-- was dropped at the resume, so a waiter that came during the stall took the lock first
-- (tests/queue_review4.rs). So a stall shorter than the queue keys' TTL keeps the live waiters, and a waiter
-- that is stopped or dead is dropped at most a front lifetime and a heartbeat of the waiters behind
-- (pending_ahead) later than its expiry (docs/queue.md, "A node that stalls"). Costs O(log N) calls,
-- and two more for each waiter whose expiry passed. `except` (the caller) is not woken.
local function keep_time(queue, alive, waiters, seen, now_ms, lifetime, prefix, except)
  local last = tonumber(redis.call('GET', seen) or '')
  if last and now_ms > last then
    local due = redis.call('ZRANGEBYSCORE', alive, '(' .. last, now_ms, 'WITHSCORES')
    for i = 1, #due, 2 do
      local w = due[i]
      local until_ms = moved_expiry(waiters, w, tonumber(due[i + 1]), last, now_ms, lifetime, prefix)
      if until_ms then
        if w ~= except then
          local sent = redis.pcall('PUBLISH', prefix .. '\031' .. w, 'moved')
          if type(sent) == 'table' and sent.err then
            -- Not woken (the caller's ACL does not cover this waiter's channel): it beats at its
            -- own pace, at most the longest interval (30 s, queue.rs LONGEST), so it keeps three
            -- of those besides, as a heartbeat from the back of the queue would give it.
            until_ms = until_ms + 3 * 30000
          end
        end
        redis.call('ZADD', alive, 'XX', string.format('%.1f', until_ms + 0.5), w)
      end
    end
  end
  local keep = redis.call('PTTL', queue)
  if keep > 0 then
    redis.call('SET', seen, now_ms, 'PX', keep)
  end
end
