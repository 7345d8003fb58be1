-- Round 1 of a grant: take the lock if it is free, count the grant on the fencing counter and record
-- the holder, all in one atomic step.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, ttl ms, quarantine ms, host, pid, command line
-- Returns {1, fence, run id}                     granted (fence as a decimal string, exact over 64
--                                                bits; the server's run id, which changes with every
--                                                restart and tells two spellings of one server apart)
--         {0, pttl, host, pid, command, run id}  held by someone else
--         {2, remaining quarantine ms, run id, uptime s}
--                                                this node started too recently to vote
local token, ttl = ARGV[1], ARGV[2]
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
local current = redis.call('GET', KEYS[1])
if current == token then
  -- The same attempt sent again after a dropped connection: it already won here.
  return {1, redis.call('GET', KEYS[2]) or '0', run_id()}
end
if current then
  -- Name the holder only if the record is the current holder's (a canonical client keeps none).
  local h = redis.call('HMGET', KEYS[3], 'token', 'host', 'pid', 'cmd')
  if h[1] ~= current then
    return {0, redis.call('PTTL', KEYS[1]), '', '', '', run_id()}
  end
  return {0, redis.call('PTTL', KEYS[1]), h[2] or '', h[3] or '', h[4] or '', run_id()}
end
local quarantine = tonumber(ARGV[3])
local counter = redis.call('GET', KEYS[2])
-- Restart quarantine, failing closed. uptime_in_seconds is floor(now) - floor(start), up to 1 s more
-- than the true uptime, so the node votes only once uptime - 1 s covers the quarantine; without a
-- readable uptime it does not vote for the whole period.
if quarantine > 0 then
  local up = tonumber(string.match(server_info(), 'uptime_in_seconds:(%d+)'))
  if not up then
    return {2, quarantine, run_id(), false}
  end
  local sure = (up - 1) * 1000
  if sure < quarantine then
    return {2, quarantine - sure, run_id(), up}
  end
end
-- The fence survives a loss of the counter: a missing counter (lost with the node's data, evicted,
-- or never made) starts from the server's clock in microseconds, above every fence handed out before
-- as long as the clock did not step back and no counter ran ahead of it (fewer than one grant per
-- microsecond; `doctor` checks both). An existing counter takes max(counter + 1, the clock's whole
-- second in microseconds), which keeps it near the clock, so that a counter restored older (an RDB
-- snapshot, the last second of an AOF) is overtaken once a second has passed; the whole second, not
-- the microsecond, keeps the counters of Redlock nodes equal from one grant to the next, so that no
-- round 2 is needed in the steady state.
local t = redis.call('TIME')
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
redis.call('SET', KEYS[1], token, 'NX', 'PX', ttl)
redis.call('HSET', KEYS[3], 'token', token, 'fence', fence, 'host', ARGV[4], 'pid', ARGV[5],
  'cmd', ARGV[6], 'acquired_ms', t[1] * 1000 + math.floor(t[2] / 1000), 'ttl_ms', ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {1, fence, run_id()}
