package redislock

import "github.com/redis/go-redis/v9"

// The broken variants of this backend that the suite must fail
// (locktest.Teeth): each replaces one owner-checked script with the bare
// command a naive lock would use.
const (
	BareDel     = "bare-del"     // Release deletes the key whoever owns it
	BarePexpire = "bare-pexpire" // renewal extends the key whoever owns it
)

// Break gives l the broken variant named, if it is one of this package's.
func Break(l *Locker, variant string) {
	switch variant {
	case BareDel:
		l.scripts.release = redis.NewScript(`return redis.call('del', KEYS[1])`)
	case BarePexpire:
		l.scripts.renew = redis.NewScript(`return redis.call('pexpire', KEYS[1], ARGV[2])`)
	}
}
