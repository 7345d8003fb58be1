-- Round 1 of a grant, and the caller's place in the queue, in one atomic step: take a free slot of
-- the lock if no live waiter is queued ahead of the caller, count the grant on the fencing counter
-- and record the holder; otherwise queue the caller (or refresh its heartbeat) and say who holds the
-- lock and where the caller stands. See docs/queue.md.
-- KEYS: lock (slot 1), fence counter, holder hash (slot 1's), limit, queue, alive, waiters, tickets,
--       superseded, seen (the server time of the last script that looked at the queue), the record
--       of this token's release (`release.lua`; the rollback of this very attempt, when it exists)
-- ARGV: token, ttl ms, quarantine ms, host, pid, command line, limit N, slot key base, holder hash
--       base (slot i >= 2 is `base .. i`), the slot wanted ('' or 0 = the lowest free one),
--       waiter id, ticket ('' = none yet), mode ('n' one attempt, never queued; 'w' wait; 's' wait
--       and supersede the waiters queued before the caller), note, wake channel prefix, a waiter's lifetime at the
--       front of the queue in ms (three heartbeats), the longest heartbeat interval in ms, '1' when
--       the caller listens on its wake channel on this node (its subscription stands), the caller's
--       slack in ms ('' = 0: how much longer than its interval an attempt of its may take, two node
--       timeouts), added to each of its lifetimes, the server time (ms) after which mode 's'
--       displaces nobody (none: displace; the caller stops waiting for this answer then)
-- Returns {1, fence, run id, slot}               granted (fence as a decimal string, exact over 64
--                                                bits; the server's run id, which changes with every
--                                                restart and tells two spellings of one server apart)
--         {0, pttl, host, pid, command, run id, ticket, ahead, waiting, note, interval ms,
--          {{slot, host, pid, command, note}, ...}, hint ms, server time ms}
--                                                no slot for us (pttl: the soonest a slot frees), or
--                                                live waiters are queued ahead (ticket '' when the
--                                                caller is not queued; interval: when to heartbeat;
--                                                then every holder of a semaphore, N > 1; hint:
--                                                come back within it, a waiter ahead is pending,
--                                                0 = none)
--         {2, remaining quarantine ms, run id, uptime s, ticket, ahead, waiting, interval ms, hint ms,
--          server time ms}
--                                                this node started too recently to vote
--         {3, the limit in use, host, pid, command, run id, 'peer' when held by a client that is
--          not lockctl}                          the name is used with another limit
--         {4, record of the superseding waiter (JSON), run id}
--                                                the caller was displaced by a --supersede waiter
local token, ttl = ARGV[1], ARGV[2]
-- The probe of the channel rights, before anything else: a grant publishes nothing, yet the queue
-- works only by the wakes that releases, breaks and departures publish on the waiters' channels,
-- and a waiter listens on its own. So the caller must be able to publish on the wake channels
-- (`<wake prefix>\031<id>`) before it may hold or queue: an ACL user without the `&` rules is
-- refused here (the script raises), with nothing changed. Every other PUBLISH of the scripts is a
-- pcall (release.lua), so no refusal comes after a write. Redis 7 and Valkey check the right
-- without publishing (`redis.acl_check_cmd`): a PUBLISH would travel to every replica and, on a
-- cluster, to every node. Redis 6.2 has no such check and publishes: nobody listens on this
-- channel (no waiter id is empty), and the server answers a refusal with a raised error.
if not redis.acl_check_cmd then
  redis.call('PUBLISH', ARGV[15] .. '\031', 'probe')
elseif not redis.acl_check_cmd('PUBLISH', ARGV[15] .. '\031', 'probe') then
  error({err = 'NOPERM no permissions to access one of the channels, or to run PUBLISH'})
end
-- This attempt was rolled back here already: it timed out on this node, was refused, and its
-- rollback, sent on a new connection as well, ran before it (the server runs its connections in any
-- order after a stall). It changes nothing (no grant, no place in the queue, no fencing counter, no
-- heartbeat) and answers busy to nobody: tokens are new per attempt, so no caller waits for it.
if redis.call('EXISTS', KEYS[11]) == 1 then
  return {0, -1, '', '', '', ''}
end
local limit = tonumber(ARGV[7]) or 1
local want = tonumber(ARGV[10]) or 0
local id, ticket, mode, note, wake = ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15]
local alive_ms, longest = tonumber(ARGV[16]), tonumber(ARGV[17])
local slack = tonumber(ARGV[19]) or 0
-- The caller's front lifetime: three heartbeats, and its slack.
local front_ms = alive_ms + slack
local info
local function server_info()
  info = info or redis.call('INFO', 'server')
  return info
end
local function run_id()
  return string.match(server_info(), 'run_id:(%x+)') or ''
end
-- Decimal strings without leading zeros compare by length, then lexically: exact above 2^53.
local function less(a, b)
  return #a < #b or (#a == #b and a < b)
end
local function slot_key(i)
  if i == 1 then return KEYS[1] end
  return ARGV[8] .. i
end
local function holder_key(i)
  if i == 1 then return KEYS[3] end
  return ARGV[9] .. i
end
-- The holder of slot i, if its record is the current holder's (a canonical client keeps none).
local function holder_of(i, current)
  local h = redis.call('HMGET', holder_key(i), 'token', 'host', 'pid', 'cmd', 'limit', 'note')
  if h[1] ~= current then
    return nil
  end
  return h
end

-- The front of the queue: the first `window` waiters heartbeat every alive_ms / 3 and live alive_ms
-- (and their slack) after their last heartbeat; those behind heartbeat less often the further back they stand (see
-- docs/queue.md, "Liveness"). After waiters left, the ones that moved into the front have their
-- expiry brought down (front.lua).
local window = limit + 1
local function front_moved(now_ms)
  clamp_front(KEYS[5], KEYS[6], KEYS[7], window, now_ms, front_ms, wake, id)
end
-- The heartbeat interval of the waiter at place p (0 = the head): alive_ms / 3 at the front, then
-- growing with the square of the distance from it, so that the heartbeats of any number of waiters
-- sum to a bounded rate (up to the cap `longest`).
local function interval_at(p)
  local beat = alive_ms / 3
  if p < window then
    return beat
  end
  local d = p - window + 1
  return math.min(beat * (1 + d * d), math.max(longest, beat))
end

-- Slots: `free` counts the free slots of the `limit`, `pick` is the one we would take. A slot is its
-- own key, so that with Redlock each slot is a mutex of its own (see docs/queue.md).
local free, pick = 0, nil
local busy_pttl, busy_slot, busy_token = nil, nil, nil
local tokens = {}
for i = 1, limit do
  local current = redis.call('GET', slot_key(i))
  tokens[i] = current
  if current == token then
    -- The same attempt sent again after a dropped connection: it already won here, with the fence
    -- its record keeps. Its record's fence is written again, unchanged: a write, so that the `WAIT`
    -- that follows on this new connection waits for the replicas to have the first send's grant
    -- too. A send that writes nothing sets no offset for its connection on some servers (Valkey 8),
    -- whose `WAIT` then answered at once with a stopped replica counted.
    local fence = redis.call('HMGET', holder_key(i), 'fence')[1]
    if fence then
      redis.call('HSET', holder_key(i), 'fence', fence)
    end
    return {1, fence or redis.call('GET', KEYS[2]) or '0', run_id(), i}
  end
  if not current then
    free = free + 1
    if not pick and (want == 0 or want == i) then
      pick = i
    end
  else
    local pttl = redis.call('PTTL', slot_key(i))
    if not busy_pttl or pttl < busy_pttl then
      busy_pttl, busy_slot, busy_token = pttl, i, current
    end
  end
end

-- Waiters whose heartbeat expired (killed or stopped) are dropped first.
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
-- A new ticket: max(counter + 1, server time in us), so the order survives a restart that lost the
-- counter.
local function new_ticket()
  local n = redis.call('INCR', KEYS[8])
  local us = t[1] * 1000000 + tonumber(t[2])
  if n < us then
    n = us
    redis.call('SET', KEYS[8], string.format('%.0f', n))
  end
  return string.format('%.0f', n)
end
-- After a stall of this node the expiries move forward instead (front.lua).
keep_time(KEYS[5], KEYS[6], KEYS[7], KEYS[10], now_ms, front_ms, wake, id)
local dead = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now_ms)
if #dead > 0 then
  redis.call('ZREM', KEYS[5], unpack(dead))
  redis.call('ZREM', KEYS[6], unpack(dead))
  redis.call('HDEL', KEYS[7], unpack(dead))
  if redis.call('ZCARD', KEYS[5]) == 0 then
    -- Nobody waits any more: the rest goes now, not at the end of the keys' floor.
    redis.call('DEL', KEYS[8], KEYS[10])
  end
end

-- Limit: every client of a name must use the same N, holder or waiter. The `limit` key records it
-- while a slot is in use or N > 1 waiters wait; a plain lock (N = 1) keeps none: its holder record
-- says limit 1, and so do its waiters' records (the head's is read, every waiter having passed this
-- check).
local recorded = tonumber(redis.call('GET', KEYS[4]) or '')
if not recorded then
  -- Waiters of a plain lock keep no `limit` key: their records say the limit they wait with.
  local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
  local rec = head and redis.call('HGET', KEYS[7], head)
  if rec then
    local ok, w = pcall(cjson.decode, rec)
    if ok and type(w) == 'table' and tonumber(w.limit) then
      recorded = tonumber(w.limit)
    end
  end
end
if limit > 1 then
  local current = tokens[1]
  local h = current and holder_of(1, current)
  if current and not h then
    -- Slot 1's key without a lockctl record: a canonical client's plain lock (redis-py `Lock`,
    -- node-redlock, pottery), a client of limit 1 that knows nothing of slots. A semaphore is
    -- refused beside it as beside a plain lockctl holder, whatever the `limit` key says.
    return {3, 1, '', '', '', run_id(), 'peer'}
  end
  if h and not recorded then
    recorded = tonumber(h[5]) or 1
  end
end
if recorded and recorded ~= limit then
  for i = 1, recorded do
    local current = redis.call('GET', slot_key(i))
    local h = current and holder_of(i, current)
    if h then
      return {3, recorded, h[2] or '', h[3] or '', h[4] or '', run_id()}
    end
  end
  if redis.call('ZCARD', KEYS[5]) > 0 then
    return {3, recorded, '', '', '', run_id()}
  end
  for i = 2, recorded do
    -- A slot's key without its holder record (another client's) still holds the slot.
    if redis.call('EXISTS', slot_key(i)) == 1 then
      return {3, recorded, '', '', '', run_id()}
    end
  end
  -- No lockctl holder, no slot 2..N held and nobody waits (the dead were dropped above): a limit
  -- left by a release that ran before the last waiter was dropped, or by an older client, is
  -- forgotten.
  redis.call('DEL', KEYS[4])
end

-- Queue: `ahead` counts the live waiters before this caller. A caller with a ticket (Redlock: the
-- maximum over the nodes) is placed by it on every node, so that every node orders alike.
if id ~= '' then
  -- The records of displaced waiters live a minute each (`until`, server ms). The hash's field ''
  -- holds the soonest `until`: once it passes, the expired records go.
  local soonest = tonumber(redis.call('HGET', KEYS[9], '') or '')
  if soonest and soonest <= now_ms then
    local all = redis.call('HGETALL', KEYS[9])
    local gone, left = {}, nil
    for i = 1, #all, 2 do
      if all[i] ~= '' then
        local ok, r = pcall(cjson.decode, all[i + 1])
        local till = ok and type(r) == 'table' and tonumber(r['until'])
        if till and till <= now_ms then
          gone[#gone + 1] = all[i]
        elseif till and (not left or till < left) then
          left = till
        end
      end
    end
    if #gone > 0 then
      redis.call('HDEL', KEYS[9], unpack(gone))
    end
    if left then
      redis.call('HSET', KEYS[9], '', left)
    else
      redis.call('HDEL', KEYS[9], '')
    end
  end
  local by = redis.call('HGET', KEYS[9], id)
  if by then
    -- Displaced here by a superseder that comes before the caller in the order every node agrees
    -- on (by ticket, then id): a node that saw the caller arrive first, before either carried its
    -- ticket here. Two superseders at once would each displace the other on some node; only the
    -- later one's displacement stands, and the caller is put back at its ticket below.
    local ok, r = pcall(cjson.decode, by)
    local t = ok and type(r) == 'table' and r.ticket
    if ticket ~= '' and type(t) == 'string'
        and (less(t, ticket) or (t == ticket and type(r.id) == 'string' and r.id < id)) then
      redis.call('HDEL', KEYS[9], id)
    else
      return {4, by, run_id()}
    end
  end
end
local queued = false
if id ~= '' and mode ~= 'n' then
  local score = redis.call('ZSCORE', KEYS[5], id)
  -- --supersede: the waiters below this score here are displaced. Taken before the carried ticket
  -- lowers the caller's score: a node that ran the caller's first attempt late (stopped meanwhile)
  -- gave it a ticket above the carried one, and the waiters between the two came here after it.
  -- The carried ticket bounds it too, so that the caller itself (now at that ticket) and those
  -- placed above it everywhere are never below the bound.
  local bound
  if score then
    queued = true
    bound = score
    if ticket ~= '' and score ~= ticket then
      redis.call('ZADD', KEYS[5], 'XX', ticket, id)
      if less(ticket, score) then
        bound = ticket
      end
    end
  end
  if ticket ~= '' and less(redis.call('GET', KEYS[8]) or '0', ticket) then
    redis.call('SET', KEYS[8], ticket)
  end
  if mode == 's' and not queued and ticket == '' then
    -- An older client's first attempt (this one sends 's' only once queued): queued below.
    ticket = new_ticket()
    bound = ticket
  end
  -- Past the caller's deadline it no longer waits for this answer: it may have given up since (a
  -- stopped node runs what its socket buffered when it resumes), so it displaces nobody.
  local late = ARGV[20] and ARGV[20] ~= '' and now_ms > tonumber(ARGV[20])
  if mode == 's' and bound and not late then
    -- --supersede, sent only once a quorum (one node: the node) queued or granted the caller in an
    -- earlier attempt, so that an attempt refused anywhere displaces nobody (docs/queue.md). The
    -- waiters queued here before it stop waiting and learn who displaced them: those below the
    -- bound. A node where it is not queued (put back after a restart, or its grant here was
    -- rolled back) displaces nobody.
    local older = {}
    for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. bound)) do
      if w ~= id then
        older[#older + 1] = w
      end
    end
    if #older > 0 then
      local till = now_ms + 60000
      local by = cjson.encode({host = ARGV[4], pid = ARGV[5], cmd = ARGV[6], note = note,
        ['until'] = till, ticket = ticket ~= '' and ticket or bound, id = id})
      for _, w in ipairs(older) do
        redis.call('HSET', KEYS[9], w, by)
        redis.pcall('PUBLISH', wake .. '\031' .. w, 'superseded')
      end
      if not redis.call('HGET', KEYS[9], '') then
        redis.call('HSET', KEYS[9], '', till)
      end
      -- The hash goes with its newest record.
      redis.call('PEXPIRE', KEYS[9], 60000)
      redis.call('ZREM', KEYS[5], unpack(older))
      redis.call('ZREM', KEYS[6], unpack(older))
      redis.call('HDEL', KEYS[7], unpack(older))
      front_moved(now_ms)
    end
  end
end
local ahead
if queued then
  ahead = redis.call('ZRANK', KEYS[5], id)
elseif ticket ~= '' and mode ~= 'n' then
  ahead = redis.call('ZCOUNT', KEYS[5], '-inf', '(' .. ticket)
else
  ahead = redis.call('ZCARD', KEYS[5])
end

local quarantined
if pick then
  -- Restart quarantine, failing closed (asked whenever a slot is free, so that a waiter behind
  -- others learns that the node cannot vote anyway). uptime_in_seconds is floor(now) - floor(start), up to 1 s
  -- more than the true uptime, so the node votes only once uptime - 1 s covers the quarantine;
  -- without a readable uptime it does not vote for the whole period.
  local quarantine = tonumber(ARGV[3])
  if quarantine > 0 then
    local up = tonumber(string.match(server_info(), 'uptime_in_seconds:(%d+)'))
    if not up then
      quarantined = {2, quarantine, run_id(), false}
    else
      local sure = (up - 1) * 1000
      if sure < quarantine then
        quarantined = {2, quarantine - sure, run_id(), up}
      end
    end
  end
end

if ahead >= free or not pick or quarantined then
  -- When to heartbeat: only a queued caller has to.
  local interval = alive_ms / 3
  if id ~= '' and mode ~= 'n' then
    -- Queue the caller (its first refusal is its enqueue) and take its heartbeat.
    if not queued then
      -- A first enqueue counts as listening (see the heartbeat below); a waiter put back at the
      -- ticket it carries (this node lost its queue, or dropped it) has been waiting and says
      -- whether it listens here: after a restart its subscription may stay down for seconds.
      local listening = ticket == '' or ARGV[18] == '1'
      if ticket == '' then
        ticket = new_ticket()
      end
      redis.call('ZADD', KEYS[5], ticket, id)
      redis.call('HSET', KEYS[7], id, cjson.encode({host = ARGV[4], pid = ARGV[5], cmd = ARGV[6],
        note = note, since_ms = now_ms, ticket = ticket, limit = limit, front = front_ms,
        beat = alive_ms / 3, sub = listening}))
      ahead = redis.call('ZRANK', KEYS[5], id)
    else
      ticket = redis.call('ZSCORE', KEYS[5], id)
      -- Whether it listens here, as of this heartbeat (`sub`): after a stall of this node, a waiter
      -- whose subscription stood and is gone died (front.lua, moved_expiry). A first enqueue counts as
      -- listening: the waiter subscribes right after it, so one that never made its next attempt
      -- died there (or was stopped with the node in that window). Written only when it changes.
      local raw = redis.call('HGET', KEYS[7], id)
      local sub = ARGV[18] == '1'
      if raw and (string.find(raw, '"sub":true', 1, true) ~= nil) ~= sub then
        local ok, rec = pcall(cjson.decode, raw)
        if ok and type(rec) == 'table' then
          rec.sub = sub
          redis.call('HSET', KEYS[7], id, cjson.encode(rec))
        end
      end
    end
    interval = interval_at(ahead)
    if ARGV[18] ~= '1' then
      -- Not listening here (not subscribed yet, or its subscription was lost): only its heartbeats
      -- show that it lives, so it heartbeats as at the front. A longer expiry goes only to a waiter
      -- whose subscription shows it alive meanwhile (status.lua lists it while that lasts).
      interval = math.min(interval, alive_ms / 3)
    end
    redis.call('ZADD', KEYS[6], now_ms + 3 * interval + slack, id)
    -- The queue's keys outlive the longest expiry by a front lifetime (`live`), and never less than
    -- a waiter far back lives (three of the longest intervals and the slack) and a front lifetime:
    -- Redis expires them by the wall clock, also while this node is stopped, and a stall that
    -- outlived them would lose the order (docs/queue.md, "A node that stalls"). They go with the
    -- last waiter, or when a script drops it.
    local last = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
    local live = math.max(tonumber(last[2]) - now_ms, 0) + front_ms
    local keep = math.max(live, 3 * longest + slack + front_ms)
    for _, i in ipairs({5, 6, 7, 8, 10}) do
      redis.call('PEXPIRE', KEYS[i], keep)
    end
    if not queued then
      -- The enqueue that created the queue looked at it too: keep_time, run before, had no queue
      -- to keep the time by, and a stall right after would otherwise find no `seen`.
      redis.call('SET', KEYS[10], now_ms, 'NX', 'PX', keep)
    end
    if limit > 1 and redis.call('PTTL', KEYS[4]) < live then
      -- The limit outlives the waiters' heartbeats too, so a client with another limit is told
      -- (not the floor: after a stall the waiters' records still say it).
      redis.call('SET', KEYS[4], limit, 'PX', live)
    end
  else
    ticket = ''
  end
  local waiting = redis.call('ZCARD', KEYS[5])
  if #dead > 0 then
    front_moved(now_ms)
    if free > 0 then
      -- Waiters moved up to a free slot: wake them (the caller, if one of them, is answering now).
      for _, w in ipairs(redis.call('ZRANGE', KEYS[5], 0, free - 1)) do
        if w ~= id then
          redis.pcall('PUBLISH', wake .. '\031' .. w, 'head')
        end
      end
    end
  end
  -- Come back at the front's pace while a waiter ahead is pending (front.lua): 0 = no hint.
  local hint = 0
  if ticket ~= '' and interval > alive_ms / 3 and pending_ahead(KEYS[5], KEYS[6], window, ahead) then
    hint = alive_ms / 3
  end
  if quarantined then
    table.insert(quarantined, ticket)
    table.insert(quarantined, ahead)
    table.insert(quarantined, waiting)
    table.insert(quarantined, interval)
    table.insert(quarantined, hint)
    table.insert(quarantined, now_ms)
    return quarantined
  end
  -- A semaphore's busy message names every holder.
  local holders = {}
  for i = 1, limit > 1 and limit or 0 do
    if tokens[i] then
      local r = holder_of(i, tokens[i]) or {}
      holders[#holders + 1] = {i, r[2] or '', r[3] or '', r[4] or '', r[6] or ''}
    end
  end
  local h = busy_token and holder_of(busy_slot or 1, busy_token)
  if not h then
    return {0, busy_pttl or -2, '', '', '', run_id(), ticket, ahead, waiting, '', interval, holders,
      hint, now_ms}
  end
  return {0, busy_pttl, h[2] or '', h[3] or '', h[4] or '', run_id(), ticket, ahead, waiting,
    h[6] or '', interval, holders, hint, now_ms}
end

-- Granted: the caller leaves the queue; the last one out takes the queue's keys along. Its place is
-- kept with the holder record, so that a rollback of this grant (the attempt lost elsewhere, or timed
-- out and its reply never read) puts it back where it stood (release.lua).
local place
if queued then
  place = cjson.encode({id = id, ticket = redis.call('ZSCORE', KEYS[5], id),
    alive = redis.call('ZSCORE', KEYS[6], id), rec = redis.call('HGET', KEYS[7], id)})
  redis.call('ZREM', KEYS[5], id)
  redis.call('ZREM', KEYS[6], id)
  redis.call('HDEL', KEYS[7], id)
end
if redis.call('ZCARD', KEYS[5]) == 0 then
  redis.call('DEL', KEYS[6], KEYS[7], KEYS[8], KEYS[10])
elseif queued or #dead > 0 then
  front_moved(now_ms)
end
local counter = redis.call('GET', KEYS[2])
-- The fence survives a loss of the counter: a missing counter (lost with the node's data, evicted,
-- or never made) starts from the server's clock in microseconds, above every fence handed out before
-- as long as the clock did not step back and no counter ran ahead of it (fewer than one grant per
-- microsecond; `doctor` checks both). An existing counter takes max(counter + 1, the clock's whole
-- second in microseconds), which keeps it near the clock, so that a counter restored older (an RDB
-- snapshot, the last second of an AOF) is overtaken once a second has passed; the whole second, not
-- the microsecond, keeps the counters of Redlock nodes equal from one grant to the next, so that no
-- round 2 is needed in the steady state. One counter serves every slot, so fences increase across
-- all grants of the name.
local fence
if not counter then
  fence = t[1] .. string.format('%06d', tonumber(t[2]))
  redis.call('SET', KEYS[2], fence)
else
  redis.call('INCR', KEYS[2])
  fence = redis.call('GET', KEYS[2])
  local second = t[1] .. '000000'
  if less(fence, second) then
    redis.call('SET', KEYS[2], second)
    fence = second
  end
end
redis.call('SET', slot_key(pick), token, 'NX', 'PX', ttl)
redis.call('HSET', holder_key(pick), 'token', token, 'fence', fence, 'host', ARGV[4], 'pid', ARGV[5],
  'cmd', ARGV[6], 'acquired_ms', now_ms, 'ttl_ms', ttl, 'slot', pick, 'limit', limit)
if note ~= '' then
  redis.call('HSET', holder_key(pick), 'note', note)
end
if place then
  redis.call('HSET', holder_key(pick), 'queued', place)
end
redis.call('PEXPIRE', holder_key(pick), ttl)
if limit > 1 and redis.call('PTTL', KEYS[4]) < tonumber(ttl) then
  -- Outlives every slot's lease, so a client with another limit is told while any slot is held.
  redis.call('SET', KEYS[4], limit, 'PX', ttl)
end
return {1, fence, run_id(), pick}
