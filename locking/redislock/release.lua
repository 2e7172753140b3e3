-- Delete the lock only while this owner holds it: a bare DEL would free
-- another holder's lock (ours expired, and someone else took it).
-- KEYS[1] lock; ARGV[1] owner. Returns 1 if released, 0 if not held.
if redis.call('get', KEYS[1]) == ARGV[1] then
	return redis.call('del', KEYS[1])
end
return 0
