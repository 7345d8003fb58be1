-- Round 1 of a grant: take the lock if it is free, count the grant on the fencing counter and record
-- the holder, all in one atomic step.
-- KEYS: lock, fence counter, holder hash
-- ARGV: token, ttl ms, quarantine ms, host, pid, command line, kept data ('1' when the client
--       proved the node fsyncs every write to an AOF: appendfsync always, no-appendfsync-on-rewrite no)
-- Returns {1, fence, run id}                     granted (fence as a decimal string, exact over 64
--                                                bits; the server's run id, which changes with every
--                                                restart and tells two spellings of one server apart)
--         {0, pttl, host, pid, command, run id}  held by someone else
--         {2, remaining quarantine ms, run id, uptime s}
--                                                this node started too recently to vote
local token, ttl = ARGV[1], ARGV[2]
local info
local function run_id()
  info = info or redis.call('INFO', 'server')
  return string.match(info, 'run_id:(%x+)') or ''
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
-- A fencing counter survives a restart only in data loaded from disk: on a node that fsyncs every
-- write, it shows that this lock's history was loaded, so the node forgot no grant of it.
if ARGV[7] == '1' and redis.call('EXISTS', KEYS[2]) == 1 then
  quarantine = 0
end
if quarantine > 0 then
  info = redis.call('INFO', 'server')
  local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
  if up and up * 1000 < quarantine then
    return {2, quarantine - up * 1000, run_id(), up}
  end
end
redis.call('SET', KEYS[1], token, 'NX', 'PX', ttl)
redis.call('INCR', KEYS[2])
local fence = redis.call('GET', KEYS[2])
local t = redis.call('TIME')
redis.call('HSET', KEYS[3], 'token', token, 'fence', fence, 'host', ARGV[4], 'pid', ARGV[5],
  'cmd', ARGV[6], 'acquired_ms', t[1] * 1000 + math.floor(t[2] / 1000), 'ttl_ms', ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {1, fence, run_id()}
