-- Extend the lock only while this owner holds it: a bare PEXPIRE could
-- extend another holder's lock, and a missing key is never recreated, so
-- a renewal cannot revive an expired lease.
-- KEYS[1] lock; ARGV[1] owner, ARGV[2] ttl in ms. Returns 1 if extended.
if redis.call('get', KEYS[1]) == ARGV[1] then
	return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
