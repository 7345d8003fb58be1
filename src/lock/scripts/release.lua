-- Compare-and-delete: remove the lock only where it still holds our token, then wake the waiters.
-- KEYS: lock, holder hash
-- ARGV: token, release channel
-- Returns 1 when our lock was deleted, 0 when it was not ours (expired, broken, taken by another).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
