package redislock

import "github.com/redis/go-redis/v9"

// The broken variants of this backend that the suite must fail
// (locktest.Teeth): each replaces one owner-checked script with the bare
// command a naive lock would use.
const (
	BareDel     = "bare-del"     // Release deletes the key whoever owns it
	BarePexpire = "bare-pexpire" // renewal extends the key whoever owns it
)

// Break installs the broken variant named, if it is one of this package's.
func Break(variant string) {
	switch variant {
	case BareDel:
		scripts.Release = redis.NewScript(`return redis.call('del', KEYS[1])`)
	case BarePexpire:
		scripts.Renew = redis.NewScript(`return redis.call('pexpire', KEYS[1], ARGV[2])`)
	}
}
